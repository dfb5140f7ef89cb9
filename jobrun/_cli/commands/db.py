"""The ``jobrun db`` commands: migrate jobrun's tables, show their revision, check for drift.

Kept apart from the commands that read or act on runs, so that those load neither
the schema checks nor the many-databases machinery. Alembic itself is imported
only inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import IO

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._cli.app import cli
from jobrun._cli.connect import (
    missing_sqlite_message,
    open_engine,
    run_action,
    schema_option,
    sqlite_file,
)
from jobrun._cli.many_databases import chosen_urls, many_urls_options, report, run_on_each
from jobrun._cli.schema_check import SchemaState, check, revisions
from jobrun.sql.upgrades.migrate import alembic_ini, upgrade
from jobrun.sql.upgrades.provisioning import revision_of


@cli.group()
def db() -> None:
    """Create, migrate and check jobrun's tables (Alembic revisions shipped with jobrun)."""


def _revision(value: str | None) -> str:
    return value or "none (no jobrun schema)"


@db.command("upgrade")
@many_urls_options
@schema_option
def db_upgrade(
    urls: tuple[str, ...], urls_file: IO[str] | None, concurrency: int, schema: str | None
) -> None:
    """Migrate jobrun's tables to the newest revision, creating them if needed.

    Only jobrun's tables and its own version table are touched; a host's tables
    and its alembic_version stay as they are. A SQLite file is created if missing.
    With several databases, each gets a line, failures do not stop the others,
    and the exit status is 1 if any failed.

    \b
    Example:
      jobrun db upgrade --url sqlite:///app.db
      jobrun db upgrade --urls-file tenants.txt --concurrency 16
    """
    targets = chosen_urls(urls, urls_file)
    if len(targets) > 1:

        async def each(engine: AsyncEngine) -> tuple[str | None, str | None]:
            before = await revision_of(engine, schema)
            await upgrade(engine, schema=schema)
            return before, await revision_of(engine, schema)

        def line(value: tuple[str | None, str | None]) -> tuple[str, str]:
            before, after = value
            if before == after:
                return "already at head", f"already at head: {_revision(after)}"
            return "upgraded", f"upgraded from {_revision(before)} to {after} (head)"

        if report(run_on_each(targets, each, concurrency), line)["failed"]:
            raise SystemExit(1)
        return

    # Imported here: Alembic is loaded by the commands that migrate, not by the others.
    from alembic.util import CommandError

    async def act() -> tuple[SchemaState, SchemaState]:
        async with open_engine(targets[0], create=True, schema=schema) as engine:
            before = await revisions(engine, schema)
            try:
                await upgrade(engine, schema=schema)
            except CommandError as error:
                raise click.ClickException(f"cannot upgrade: {error}") from error
            return before, await revisions(engine, schema)

    before, after = run_action(act)
    if before.current == after.current:
        click.echo(f"already at head: {_revision(after.current)}")
    else:
        click.echo(f"upgraded from {_revision(before.current)} to {after.current} (head)")


def _existing_database(engine: AsyncEngine) -> None:
    path = sqlite_file(engine.url)
    if path is not None and not path.exists():
        url_text = engine.url.render_as_string(hide_password=True)
        raise FileNotFoundError(missing_sqlite_message(path, url_text))


def _state_of_each(
    targets: list[str],
    read: Callable[[AsyncEngine, str | None], Awaitable[SchemaState]],
    schema: str | None,
    concurrency: int,
    line: Callable[[SchemaState], tuple[str, str]],
    failing: tuple[str, ...] = (),
) -> SchemaState | None:
    """``read``'s state of the one database in ``targets``, for the command to print.

    With several, it prints a line each (``line``: its tally and its text), exits
    with status 1 when any failed or was tallied as one of ``failing``, and
    returns ``None``; a SQLite file that does not exist is a failure, never created.
    """
    if len(targets) > 1:

        async def each(engine: AsyncEngine) -> SchemaState:
            _existing_database(engine)
            return await read(engine, schema)

        tally = report(run_on_each(targets, each, concurrency), line)
        if any(tally[name] for name in ("failed", *failing)):
            raise SystemExit(1)
        return None

    async def act() -> SchemaState:
        async with open_engine(targets[0], schema=schema) as engine:
            return await read(engine, schema)

    return run_action(act)


@db.command("current")
@many_urls_options
@schema_option
def db_current(
    urls: tuple[str, ...], urls_file: IO[str] | None, concurrency: int, schema: str | None
) -> None:
    """Print the database's jobrun revision and the head this jobrun ships.

    \b
    Example:
      jobrun db current --url postgresql://app@db.internal/app
    """

    def line(state: SchemaState) -> tuple[str, str]:
        if state.at_head:
            return "at head", f"current {state.current} (head)"
        return "behind", f"current {_revision(state.current)}, head {state.head}"

    state = _state_of_each(chosen_urls(urls, urls_file), revisions, schema, concurrency, line)
    if state is None:
        return
    note = "" if state.at_head else "  (behind or unknown: run `jobrun db upgrade`)"
    click.echo(f"current: {_revision(state.current)}{note}")
    click.echo(f"head:    {state.head}")


def _drift_lines(state: SchemaState) -> list[str]:
    lines = [f"missing privilege: {missing}" for missing in state.missing_privileges]
    if not state.missing_privileges and not state.at_head:
        lines.append(
            f"drift: the database is at {_revision(state.current)}, head is {state.head}; "
            "run `jobrun db upgrade`"
        )
    lines.extend(f"drift: {difference}" for difference in state.differences)
    return lines


@db.command("check")
@many_urls_options
@schema_option
def db_check(
    urls: tuple[str, ...], urls_file: IO[str] | None, concurrency: int, schema: str | None
) -> None:
    """Exit 1 if jobrun's schema has drifted or the role lacks a privilege jobrun needs.

    Drift: not at head, or tables that differ (what Alembic's autogenerate
    comparison finds between jobrun's tables in the database and the tables this
    jobrun defines; other tables are ignored). On Postgres the connecting role's
    grants are checked too, and each missing one is named with its GRANT.

    \b
    Example:
      JOBRUN_DATABASE_URL=sqlite:///app.db jobrun db check || alert
    """

    def line(state: SchemaState) -> tuple[str, str]:
        if state.drifted:
            return "drifted", "; ".join(_drift_lines(state))
        return "ok", f"ok: at head {state.head}"

    targets = chosen_urls(urls, urls_file)
    state = _state_of_each(targets, check, schema, concurrency, line, failing=("drifted",))
    if state is None:
        return
    for line_text in _drift_lines(state):
        click.echo(line_text)
    if state.drifted:
        raise SystemExit(1)
    click.echo(f"ok: at head {state.head}, jobrun's tables match")


@db.command("alembic-ini")
def db_alembic_ini() -> None:
    """Print a minimal alembic.ini for this installation of jobrun.

    With it, the plain alembic command works from any directory; the URL comes
    from -x url=..., the ini's sqlalchemy.url or JOBRUN_DATABASE_URL.

    \b
    Example:
      jobrun db alembic-ini > jobrun-alembic.ini
      alembic -c jobrun-alembic.ini -x url=postgresql://app@db/app upgrade head
    """
    click.echo(alembic_ini(), nl=False)
