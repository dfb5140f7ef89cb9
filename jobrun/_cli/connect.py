"""From ``--url`` and ``--schema`` to a working store, and from jobrun's errors to
one-line messages.

Every command goes through :func:`run_action`: it runs the command's coroutine
and turns the failures an operator can cause or meet (a bad URL, a server that
does not answer, a schema that is behind, an unknown run id) into a message on
stderr and exit status 1, never a traceback. Invalid input that the library
refuses (a bad name, an empty reason) is a usage error: exit status 2. A
``--schema`` jobrun cannot use (a bad name, or any schema on SQLite) is refused
in one line with status 2 before the database is touched.

The commands that read or act on runs take :func:`url_option`, which brings
``--schema`` along; :func:`run_on_store` opens the store in that schema. So a
command that opens its store there takes ``--schema`` without passing it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, overload

import click
from sqlalchemy import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobrun._cli.app import cli
from jobrun._cli.params import json_option, run_id_argument
from jobrun._core import JobRun, get_job_run
from jobrun.errors import (
    CodeOutdatedError,
    JobConflictError,
    JobRunNotFoundError,
    JobValidationError,
    SchemaOutdatedError,
    StoreError,
)
from jobrun.sql.postgres.tenancy import checked_schema
from jobrun.sql.store import SqlJobRunStore
from jobrun.sql.urls import with_asyncio_driver

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])
S = TypeVar("S", bound=SqlJobRunStore)

URL_ENVVAR = "JOBRUN_DATABASE_URL"
CONNECT_TIMEOUT_S = 10

_url_option = click.option(
    "--url",
    envvar=URL_ENVVAR,
    show_envvar=True,
    required=True,
    metavar="URL",
    help="Database URL, e.g. sqlite+aiosqlite:///app.db or "
    "postgresql+asyncpg://user@host/db (sqlite:// and postgresql:// get those drivers).",
)

SCHEMA_ENVVAR = "JOBRUN_SCHEMA"
_SCHEMA_SETTINGS: dict[str, Any] = {
    "envvar": SCHEMA_ENVVAR,
    "show_envvar": True,
    "default": None,
    "metavar": "NAME",
    "help": "Postgres: the tenant's schema that holds jobrun's tables (default: none, "
    "the search_path decides). Refused on SQLite.",
}
schema_option = click.option("--schema", **_SCHEMA_SETTINGS)
"""``--schema`` handed to the command as ``schema`` (for commands that open engines)."""

_SCHEMA_KEY = "jobrun.schema"


def _remember_schema(
    context: click.Context, parameter: click.Parameter, value: str | None
) -> str | None:
    context.meta[_SCHEMA_KEY] = value
    return value


def url_option(command: F) -> F:
    """``--url`` and ``--schema``: the database, and the tenant's schema in it.

    The command gets ``url``; the schema stays in the click context, where
    :func:`run_on_store` takes it from.
    """
    command = click.option(
        "--schema", expose_value=False, callback=_remember_schema, **_SCHEMA_SETTINGS
    )(command)
    return _url_option(command)


def one_run_command(name: str) -> Callable[[Callable[..., Any]], click.Command]:
    """Command ``name`` on one run: ``--url`` (and ``--schema``), RUN_ID and ``--json``,
    handed to it as ``url``, ``run_id`` and ``as_json``."""

    def decorate(command: Callable[..., Any]) -> click.Command:
        return cli.command(name)(url_option(run_id_argument(json_option(command))))

    return decorate


def chosen_schema() -> str | None:
    """The ``--schema`` of the command being run (``None`` outside a command)."""
    context = click.get_current_context(silent=True)
    return None if context is None else context.meta.get(_SCHEMA_KEY)


class OneLineUsageError(click.ClickException):
    """A usage error (exit status 2) told in one line, without click's usage text."""

    exit_code = 2


def refuse_unusable_schema(engine: AsyncEngine, schema: str | None) -> None:
    """Raise :class:`OneLineUsageError` if jobrun cannot use ``schema`` on ``engine``."""
    try:
        checked_schema(engine, schema)
    except JobValidationError as error:
        raise OneLineUsageError(error.message) from error


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def parse_url(text: str) -> URL:
    """Parse and check a database URL; a plain ``sqlite://`` or ``postgresql://`` gets
    jobrun's asyncio driver. Raises ``click.ClickException`` (exit 1) when unusable."""
    try:
        url = with_asyncio_driver(text)
    except (ArgumentError, ValueError) as error:
        raise click.ClickException(f"cannot parse the database URL {text!r}") from error
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise click.ClickException(
            f"unsupported database in URL {shown}: jobrun works with sqlite and postgresql"
        )
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError as error:
        raise click.ClickException(
            f"unknown database driver in URL {shown}: use sqlite+aiosqlite or postgresql+asyncpg"
        ) from error
    if not dialect.is_async:
        raise click.ClickException(
            f"driver {url.get_driver_name()!r} in URL {shown} is not an asyncio driver: "
            "use sqlite+aiosqlite or postgresql+asyncpg"
        )
    return url


def shown_url(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL, or ``None`` for other databases and in-memory ones."""
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:") or url.query.get("uri") == "true":
        return None  # a URI filename: let SQLite interpret it
    return Path(database)


def missing_sqlite_message(path: Path, url_text: str) -> str:
    """One line for a SQLite file that is not there. A relative path says from where:
    ``sqlite:///tmp/x.db`` (three slashes) is ``tmp/x.db`` under the current directory,
    and following the hint as typed would create it there."""
    create = f"create it with `jobrun db upgrade --url {url_text}`"
    if path.is_absolute():
        return f"no SQLite database at {path}: {create}"
    scheme = url_text.partition("://")[0]
    return (
        f"no SQLite database at {path}, a path relative to {Path.cwd()} (three slashes; "
        f"for /{path} write {scheme}:////{path}): {create} to make it there"
    )


def make_engine(url: URL) -> AsyncEngine:
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql" and "timeout" not in url.query:
        connect_args["timeout"] = CONNECT_TIMEOUT_S
    try:
        return create_async_engine(url, connect_args=connect_args)
    except (ImportError, SQLAlchemyError) as error:
        raise click.ClickException(
            f"cannot use the database URL {shown_url(url)}: {first_line(error)}"
        ) from error


async def probe(engine: AsyncEngine) -> None:
    """Open one connection, so that an unreachable server is reported as such."""
    try:
        async with engine.connect():
            pass
    except (SQLAlchemyError, OSError, TimeoutError) as error:
        raise click.ClickException(
            f"cannot connect to the database at {shown_url(engine.url)}: {first_line(error)}"
        ) from error


@asynccontextmanager
async def open_engine(
    url_text: str, *, create: bool = False, schema: str | None = None
) -> AsyncIterator[AsyncEngine]:
    """An engine that has connected once, disposed of on exit.

    Unless ``create`` is set, a SQLite file must exist already: reading a
    database that is not there would otherwise create an empty one. A
    ``schema`` jobrun cannot use on this database is refused first.
    """
    url = parse_url(url_text)
    engine = make_engine(url)
    try:
        refuse_unusable_schema(engine, schema)
        path = sqlite_file(url)
        if path is not None and not create and not path.exists():
            raise click.ClickException(missing_sqlite_message(path, url_text))
        await probe(engine)
        yield engine
    finally:
        await engine.dispose()


@asynccontextmanager
async def open_store(url_text: str, schema: str | None, store_type: type[S]) -> AsyncIterator[S]:
    async with open_engine(url_text, schema=schema) as engine:
        yield store_type(engine, schema=schema)


def outdated_message(error: SchemaOutdatedError) -> str:
    """One line, with the command that fixes it (the command's ``--schema`` included)."""
    schema = chosen_schema()
    if schema is None:
        where, upgrade = "the database", "jobrun db upgrade"
    else:
        where, upgrade = f"schema {schema}", f"jobrun db upgrade --schema {schema}"
    if error.found is None:
        found = "has no jobrun schema" if schema is None else "has no jobrun tables"
    else:
        found = f"is at revision {error.found}"
    return f"{where} {found}, and this jobrun needs revision {error.expected}: run `{upgrade}`"


def run_action(action: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a command's coroutine; known failures become click exceptions (exit 1 or 2)."""
    try:
        return asyncio.run(action())
    except SchemaOutdatedError as error:
        raise click.ClickException(outdated_message(error)) from error
    except JobValidationError as error:
        raise click.UsageError(error.message) from error
    except (JobRunNotFoundError, JobConflictError, StoreError, CodeOutdatedError) as error:
        raise click.ClickException(error.message) from error
    except (SQLAlchemyError, OSError) as error:
        raise click.ClickException(f"database error: {first_line(error)}") from error


@overload
def run_on_store(url_text: str, use: Callable[[SqlJobRunStore], Awaitable[T]]) -> T: ...


@overload
def run_on_store(url_text: str, use: Callable[[S], Awaitable[T]], store_type: type[S]) -> T: ...


def run_on_store(
    url_text: str,
    use: Callable[[Any], Awaitable[T]],
    store_type: type[SqlJobRunStore] = SqlJobRunStore,
) -> T:
    """:func:`run_action` of ``use`` on the store at ``url_text`` in the command's
    ``--schema``, opened and closed around it."""
    schema = chosen_schema()

    async def act() -> T:
        async with open_store(url_text, schema, store_type) as store:
            return await use(store)

    return run_action(act)


async def existing_run(store: SqlJobRunStore, run_id: str) -> JobRun:
    """The run ``run_id``; :class:`~jobrun.errors.JobRunNotFoundError` (one line, exit
    1, through :func:`run_action`) when there is none."""
    run = await get_job_run(store, run_id)
    if run is None:
        raise JobRunNotFoundError(run_id)
    return run
