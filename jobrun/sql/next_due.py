"""When a database's next run comes due, read without a pool connection.

An idle worker sleeps until then (or until woken): see :mod:`jobrun.wakeups`.
SQLite: a short-lived stdlib ``sqlite3`` connection, opened, read and closed in
the calling thread (a read of a small local index, well under a millisecond,
and no aiosqlite thread kept for an idle database). Postgres: on the store's
presence connection, which stays open anyway for ``LISTEN``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect

from jobrun.sql.executor import Compiler, Prepared
from jobrun.sql.statements import next_due_statement
from jobrun.sql.store import SqlJobRunStore

# A WAL reader waits for nobody; this only bounds a file being recovered.
_SQLITE_TIMEOUT_S = 0.2


@functools.cache
def _sqlite_statement() -> Prepared:
    return Compiler(sqlite_dialect.dialect(paramstyle="qmark"))(next_due_statement())


def sqlite_next_due_at(path: Path) -> str | None:
    """The earliest due instant of the live runs in the SQLite file ``path`` (``None``:
    no live run). Raises ``sqlite3.Error`` when it cannot be read (no schema yet)."""
    prepared = _sqlite_statement()
    # mode=rw: a file that went away is an error here, not a new empty database.
    address = f"{path.resolve().as_uri()}?mode=rw"
    connection = sqlite3.connect(address, timeout=_SQLITE_TIMEOUT_S, uri=True)
    try:
        row = connection.execute(prepared.sql, prepared.arguments({})).fetchone()
    finally:
        connection.close()
    return None if row is None or row[0] is None else str(row[0])


async def postgres_next_due_at(store: SqlJobRunStore) -> str | None:
    """The same on Postgres, on the store's presence connection (no pool connection)."""
    schema_map: Mapping[str | None, str] | None = None
    if store.schema is not None:
        schema_map = {None: store.schema}
    prepared = Compiler(store.engine.dialect, schema_map)(next_due_statement())
    arguments = prepared.arguments({})

    async def read(raw: Any) -> Any:
        return await raw.fetchval(prepared.sql, *arguments)

    found = await store.on_presence_connection(read)
    return None if found is None else str(found)
