"""Alembic environment for jobrun's tables only.

Two ways in:
* ``jobrun.upgrade(engine)`` hands over a live connection in
  ``config.attributes["connection"]``; no URL is parsed.
* ``alembic upgrade head`` from the repository root takes the URL from
  ``-x url=...`` or the ``JOBRUN_DATABASE_URL`` environment variable, and
  logs as alembic.ini says (Alembic's INFO lines on stderr).

Only the command line configures logging: inside a host's process the logging
set-up belongs to the host, so ``jobrun.upgrade`` leaves it alone.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from jobrun.sql.migrate import _take_turns
from jobrun.sql.schema import VERSION_TABLE, metadata

config = context.config


def _only_jobrun_tables(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # A host's own tables share the database; jobrun never looks at them.
    if type_ == "table":
        return name is not None and name.startswith("_substrat_job_")
    return True


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=_only_jobrun_tables,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def _migrate(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(
        "JOBRUN_DATABASE_URL"
    )
    if not url:
        raise SystemExit(
            "no database URL: pass `-x url=sqlite+aiosqlite:///file.db` or set JOBRUN_DATABASE_URL"
        )
    return url


async def _migrate_async(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            # As in jobrun.upgrade: wait for any other migration of this database,
            # and on SQLite make the DDL one transaction that a failure rolls back.
            await _take_turns(connection)
            await connection.run_sync(_migrate)
    finally:
        await engine.dispose()


def main() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _migrate(given)
        return
    if config.config_file_name is not None:
        # Run from the ``alembic`` command (or a Config built from an ini file):
        # use that file's logging sections, leaving loggers that already exist on.
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    if context.is_offline_mode():
        context.configure(
            url=_url(), target_metadata=metadata, version_table=VERSION_TABLE, literal_binds=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    url = _url()
    if make_url(url).get_dialect().is_async:
        asyncio.run(_migrate_async(url))
    else:
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                _migrate(connection)
        finally:
            engine.dispose()


main()
