"""Alembic environment for jobrun's tables only.

Two ways in:
* ``jobrun.upgrade(engine)`` hands over a live connection in
  ``config.attributes["connection"]`` (and the tenant's schema, if any, in
  ``config.attributes["schema"]``); no URL is parsed.
* the ``alembic`` command, with the ini from ``jobrun db alembic-ini`` or the
  repository's alembic.ini. The URL comes from ``-x url=...``, else the ini's
  ``sqlalchemy.url``, else ``JOBRUN_DATABASE_URL``; ``sqlite://`` and
  ``postgresql://`` get jobrun's asyncio drivers, as on jobrun's command line.
  A Postgres schema comes from ``-x schema=...`` or ``JOBRUN_SCHEMA``.

Only the command line configures logging, and only when the ini has logging
sections: inside a host's process the logging set-up belongs to the host.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from jobrun.sql.schema import VERSION_TABLE, metadata
from jobrun.sql.upgrades.migrate import _take_turns
from jobrun.sql.urls import with_asyncio_driver

config = context.config
_LOGGING_SECTIONS = ("loggers", "handlers", "formatters")


def _only_jobrun_tables(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # A host's own tables share the database; jobrun never looks at them.
    if type_ == "table":
        return name is not None and name.startswith("_substrat_job_")
    return True


def _configure(connection: Connection, schema: str | None) -> None:
    # A host's `alembic upgrade --sql` (jobrun.migrate_on_connection): SQL text into
    # the host's output, inside the host's transaction block.
    offline = bool(config.attributes.get("offline"))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        include_object=_only_jobrun_tables,
        render_as_batch=connection.dialect.name == "sqlite",
        **({"literal_binds": True, "transactional_ddl": False} if offline else {}),
    )


def _migrate(connection: Connection, schema: str | None) -> None:
    _configure(connection, schema)
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("JOBRUN_DATABASE_URL")
    )
    if not url:
        raise SystemExit(
            "no database URL: pass `-x url=sqlite:///file.db`, set sqlalchemy.url in the "
            "ini file, or set JOBRUN_DATABASE_URL"
        )
    return with_asyncio_driver(url).render_as_string(hide_password=False)


def _schema() -> str | None:
    return context.get_x_argument(as_dictionary=True).get("schema") or os.environ.get(
        "JOBRUN_SCHEMA"
    )


async def _migrate_async(url: str, schema: str | None) -> None:
    engine = create_async_engine(url)
    try:
        if schema is not None:
            from jobrun.sql.postgres.tenancy import checked_schema

            checked_schema(engine, schema)
        async with engine.begin() as connection:
            # As in jobrun.upgrade: wait for any other migration of this database,
            # on SQLite make the DDL one transaction that a failure rolls back, and
            # with a schema work in that schema only.
            await _take_turns(connection, schema)
            await connection.run_sync(_migrate, schema)
    finally:
        await engine.dispose()


def _migrate_from_command_line() -> None:
    if config.config_file_name is not None and all(
        config.file_config.has_section(section) for section in _LOGGING_SECTIONS
    ):
        # Use the ini's logging sections, leaving loggers that already exist on.
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    url, schema = _url(), _schema()
    if context.is_offline_mode():
        if schema is not None:
            raise SystemExit("--sql (offline) cannot target a schema; run online instead")
        context.configure(
            url=url, target_metadata=metadata, version_table=VERSION_TABLE, literal_binds=True
        )
        with context.begin_transaction():
            context.run_migrations()
    elif with_asyncio_driver(url).get_dialect().is_async:
        asyncio.run(_migrate_async(url, schema))
    elif schema is not None:
        raise SystemExit("a schema needs an asyncio driver URL (postgresql+asyncpg://...)")
    else:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                _migrate(connection, None)
        finally:
            engine.dispose()


def main() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _migrate(given, config.attributes.get("schema"))
    else:
        _migrate_from_command_line()


main()
