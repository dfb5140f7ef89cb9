"""Statements sent on the caller's connection, inside the caller's transaction.

``start_job_run(..., connection=)`` writes its run in a transaction the caller
opened (an ``AsyncConnection`` of ``engine.begin()``, or an ORM session's
``await session.connection()``), so the run exists only if that transaction
commits. The store's own executor is bypassed: the statements (compiled for the
store's dialect and schema, the same texts) go through SQLAlchemy's
``exec_driver_sql``, which starts the caller's transaction on the driver if it
has not yet sent anything, and jobrun's statement hook does not see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobrun._core import refuse, refuse_type, type_name
from jobrun.sql.executor import Prepared


def _database_of(url: URL) -> tuple[str, str | None, int | None, str | None]:
    return (url.get_backend_name(), url.host, url.port, url.database)


def checked_caller_connection(connection: object, engine: AsyncEngine) -> AsyncConnection:
    """``connection`` if it is an ``AsyncConnection`` of ``engine``'s database inside an
    open transaction; else a refusal that says which of those it is not."""
    if not isinstance(connection, AsyncConnection):
        raise refuse_type(
            "connection",
            f"must be a SQLAlchemy AsyncConnection (await session.connection() for an "
            f"ORM session), got {type_name(connection)}",
        )
    if _database_of(connection.engine.url) != _database_of(engine.url):
        raise refuse(
            "connection",
            "is not of the store's database",
            message=f"connection is of {connection.engine.url!r}, not of the store's "
            f"database {engine.url!r}: a run is started in the store's database only",
        )
    if not connection.in_transaction():
        raise refuse(
            "connection",
            "is not in a transaction",
            message="connection is not in a transaction: open one (async with "
            "engine.begin() as connection) so the run commits or rolls back with it",
        )
    return connection


def caller_fetch(connection: AsyncConnection) -> Any:
    """A ``Fetch`` (as the store's executor has) that sends on ``connection``."""

    async def fetch(statement: Prepared, values: Mapping[str, Any]) -> list[Any]:
        result = await connection.exec_driver_sql(statement.sql, tuple(statement.arguments(values)))
        return list(result.fetchall()) if result.returns_rows else []

    return fetch
