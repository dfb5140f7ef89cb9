"""Running jobrun's Alembic revisions on a host's engine.

Alembic is imported only by the functions that migrate: importing jobrun, and
the schema check every store makes once, stay as cheap as SQLAlchemy itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import column, inspect, select, table, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobrun.sql.postgres.tenancy import checked_schema, enter_schema
from jobrun.sql.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config


def migrations_directory() -> Path:
    """Where the Alembic environment is: inside the wheel, or at the checkout's root."""
    packaged = Path(str(resources.files("jobrun"))) / "_migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise FileNotFoundError("jobrun's migrations are missing from this installation")


def alembic_ini() -> str:
    """A minimal alembic.ini for this installation: ``alembic -c FILE -x url=URL upgrade head``
    then works from any directory. No logging sections: Alembic's defaults apply."""
    packaged = Path(str(resources.files("jobrun"))) / "_migrations"
    # The package form keeps working if the virtualenv moves; a checkout needs the path.
    location = "jobrun:_migrations" if (packaged / "env.py").is_file() else migrations_directory()
    return (
        "# jobrun's Alembic environment (from `jobrun db alembic-ini`).\n"
        "# The URL: -x url=..., or sqlalchemy.url below, or JOBRUN_DATABASE_URL.\n"
        "# sqlite:// and postgresql:// get jobrun's asyncio drivers.\n"
        "[alembic]\n"
        f"script_location = {location}\n"
        f"version_table = {VERSION_TABLE}\n"
        "path_separator = os\n"
        "# sqlalchemy.url = postgresql://app@db.internal/app\n"
    )


def alembic_config(connection: Connection | None = None, schema: str | None = None) -> Config:
    """An Alembic config for jobrun's revisions, optionally bound to a live connection
    (and, on Postgres, to a tenant's schema, which the connection must be in)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    config.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        config.attributes["connection"] = connection
    config.attributes["schema"] = schema
    return config


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection, schema: str | None = None) -> str | None:
    """The revision recorded in jobrun's version table (in ``schema`` if given).

    ``None`` when there is none. Read with plain SQL, as Alembic's
    ``MigrationContext`` reads it, so that the check every store makes does not
    import Alembic (which costs about as much as SQLAlchemy itself).
    """
    if not inspect(connection).has_table(VERSION_TABLE, schema=schema):
        return None
    versions = table(VERSION_TABLE, column("version_num"), schema=schema)
    found = list(connection.execute(select(versions.c.version_num)).scalars())
    if len(found) > 1:
        raise RuntimeError(f"{VERSION_TABLE} records several heads: {found}")
    return found[0] if found else None


# Alembic keeps the migration in progress in module globals (``alembic.context``,
# ``alembic.op``), so two migrations in one process, even on different databases,
# must not interleave, whichever event loop or thread runs them.
_ALEMBIC_IN_USE = threading.Lock()


@asynccontextmanager
async def _alembic_turn() -> AsyncIterator[None]:
    acquiring = asyncio.ensure_future(asyncio.to_thread(_ALEMBIC_IN_USE.acquire))
    try:
        await asyncio.shield(acquiring)
    except asyncio.CancelledError:
        # The thread still gets the lock; hand it straight back when it does.
        acquiring.add_done_callback(lambda _: _ALEMBIC_IN_USE.release())
        raise
    try:
        yield
    finally:
        _ALEMBIC_IN_USE.release()


# Any fixed number, the same in every process: the key of jobrun's migration lock on Postgres.
_POSTGRES_MIGRATION_LOCK = 0x6A6F6272756E  # "jobrun"


async def _take_turns(connection: AsyncConnection, schema: str | None = None) -> None:
    """Hold a database-wide lock until the migration's transaction ends.

    Several workers that call :func:`upgrade` at start-up then migrate one after
    the other: the later ones find the head already recorded instead of failing
    on tables that already exist. On SQLite, ``BEGIN IMMEDIATE`` also makes the
    DDL one transaction (the driver would otherwise run it outside any).
    With a ``schema``, the transaction then works in that schema only.
    """
    if connection.dialect.name == "postgresql":
        await connection.execute(
            text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_MIGRATION_LOCK}
        )
        if schema is not None:
            await enter_schema(connection, schema)
    elif connection.dialect.name == "sqlite":
        raw = await connection.get_raw_connection()
        if not getattr(raw.driver_connection, "in_transaction", True):
            await connection.exec_driver_sql("BEGIN IMMEDIATE")


async def upgrade(
    engine: AsyncEngine, revision: str = "head", *, schema: str | None = None
) -> None:
    """Bring jobrun's tables on ``engine`` up to ``revision`` (default: the newest).

    Runs on one of the engine's own connections, in one transaction; only
    jobrun's tables and its version table are touched. Safe to call from many
    processes, threads and tasks at once. On Postgres, ``schema`` puts the tables
    and the version table in that schema (created if missing), one per tenant.
    """
    schema = checked_schema(engine, schema)
    async with _alembic_turn(), engine.begin() as connection:
        await _take_turns(connection, schema)
        from alembic import command

        await connection.run_sync(
            lambda sync: command.upgrade(alembic_config(sync, schema), revision)
        )


async def downgrade(
    engine: AsyncEngine, revision: str = "base", *, schema: str | None = None
) -> None:
    """Take jobrun's tables back to ``revision`` (default: none at all)."""
    schema = checked_schema(engine, schema)
    async with _alembic_turn(), engine.begin() as connection:
        await _take_turns(connection, schema)
        from alembic import command

        await connection.run_sync(
            lambda sync: command.downgrade(alembic_config(sync, schema), revision)
        )
