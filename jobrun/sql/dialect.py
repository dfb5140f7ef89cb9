"""Everything that differs between SQLite and Postgres, in one place.

* The INSERT construct that knows ``ON CONFLICT`` (both engines speak it, with
  the same partial-index target).
* How a single-statement write is sent: Postgres runs it in autocommit, one
  round trip, since a lone statement is atomic by itself; SQLite (aiosqlite)
  keeps the driver's implicit transaction, because switching a connection to
  autocommit costs a hop to the driver's thread every time.
* The pass commit: one Postgres statement (a data-modifying CTE deletes the
  ledger while the UPDATE writes the run); on SQLite two statements in one
  transaction.
* Reads: autocommit on Postgres; a plain connection on SQLite.
* Connection set-up for SQLite: WAL, a busy timeout, ``synchronous=NORMAL``.
* SQLite's hot path (a step write, the ledger read, the pass commit): the
  prebuilt statements sent straight to aiosqlite (``DirectSqliteStatement``), a
  step write in driver-level autocommit, which costs no extra hop (the driver's
  isolation level is a plain attribute), unlike SQLAlchemy's AUTOCOMMIT option.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

_configured: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()


class Dialect:
    """The per-engine choices the store makes once, at construction."""

    def __init__(self, engine: AsyncEngine, *, sqlite_busy_timeout_ms: int) -> None:
        self.name = engine.dialect.name
        if self.name not in ("sqlite", "postgresql"):
            raise ValueError(f"jobrun supports SQLite and Postgres, not {self.name!r}")
        self.is_postgres = self.name == "postgresql"
        self._engine = engine
        self._autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if self.is_postgres else None
        )
        if not self.is_postgres:
            _configure_sqlite(engine, sqlite_busy_timeout_ms)

    def insert(self, table: Any) -> Any:
        module = postgresql if self.is_postgres else sqlite
        return module.insert(table)

    @asynccontextmanager
    async def single_statement(self) -> AsyncIterator[AsyncConnection]:
        """A connection for statements that stand alone (reads, and writes durable on return).

        On Postgres, autocommit: a read or a lone write is one round trip, where a
        transaction would add BEGIN and COMMIT (or ROLLBACK) round trips.
        """
        if self._autocommit is not None:
            async with self._autocommit.connect() as connection:
                yield connection
        else:
            async with self._engine.begin() as connection:
                yield connection

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads: autocommit on Postgres (one round trip);
        on SQLite no transaction at all, which saves the commit's thread hop."""
        if self._autocommit is not None:
            async with self._autocommit.connect() as connection:
                yield connection
        else:
            async with self._engine.connect() as connection:
                yield connection


def _configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    """Set WAL and a busy timeout on every connection jobrun uses, once each.

    A checkout hook (not only a connect hook) so that connections the host's pool
    opened before the store existed are configured too; the flag in the record's
    ``info`` makes every later checkout free.
    """
    sync_engine = engine.sync_engine
    if sync_engine in _configured:
        _configured[sync_engine] = busy_timeout_ms
        return
    _configured[sync_engine] = busy_timeout_ms
    in_memory = engine.url.database in (None, "", ":memory:") or "mode=memory" in str(engine.url)

    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get("jobrun_configured"):
            return
        cursor = dbapi_connection.cursor()
        try:
            # Concurrent writers (other processes too) wait instead of failing.
            cursor.execute(f"PRAGMA busy_timeout = {int(_configured[sync_engine])}")
            if not in_memory:
                # WAL lets readers run beside the writer; NORMAL sync in WAL is safe
                # against a process crash (the case jobrun exists for) and skips an
                # fsync per commit.
                try:
                    cursor.execute("PRAGMA journal_mode = WAL")
                except Exception as error:
                    # A read-only file cannot switch journal mode; reading it still works.
                    if "readonly" not in str(error):
                        raise
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()
        record.info["jobrun_configured"] = True

    event.listen(sync_engine, "checkout", on_checkout)


class DirectSqliteStatement:
    """SQLite (aiosqlite): one prebuilt statement sent straight to the driver in autocommit.

    Through a SQLAlchemy transaction a single write costs five hops to aiosqlite's
    worker thread (cursor, execute, cursor close, commit, and the pool's rollback
    on check-in); here it costs two: one ``execute_fetchall`` that runs and commits
    the statement (autocommit, so durable when it returns) and the pool's rollback.
    The statement must return a row for each row it wrote (``RETURNING``). Used
    only while nobody listens to the engine's cursor events (see ``observed``).
    """

    def __init__(self, engine: AsyncEngine, statement: Any) -> None:
        self._dispatch = engine.sync_engine.dispatch
        compiled = statement.compile(dialect=engine.dialect)
        self._compiled = compiled
        self._sql = compiled.string
        self._names = tuple(compiled.positiontup or ())

    @staticmethod
    def usable(engine: AsyncEngine) -> bool:
        return engine.dialect.name == "sqlite" and engine.dialect.driver == "aiosqlite"

    def observed(self) -> bool:
        """Whether the host listens to the engine's statements (instrumentation, tests):
        then the statement goes through SQLAlchemy, so that every listener sees it."""
        dispatch = self._dispatch
        return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)

    async def fetch(self, connection: AsyncConnection, values: dict[str, Any]) -> list[Any]:
        positional = self._positional(values)
        raw = await connection.get_raw_connection()
        driver: Any = raw.driver_connection
        previous = driver.isolation_level
        # No transaction is open on a connection fresh from the pool; with the
        # driver's isolation level at None the statement commits itself.
        driver.isolation_level = None
        try:
            return list(await driver.execute_fetchall(self._sql, positional))
        except BaseException:
            # Cancelled or failed: the worker thread may not be done with the statement.
            # A rollback queued behind it waits for it and ends whatever it left open.
            with contextlib.suppress(Exception):
                await driver.rollback()
            raise
        finally:
            driver.isolation_level = previous

    async def fetch_in_transaction(
        self, connection: AsyncConnection, values: dict[str, Any], then: DirectSqliteStatement
    ) -> bool:
        """Run this statement and, if it returned a row, ``then``: one transaction, committed.

        Four hops (both statements, the commit, the pool's rollback) where SQLAlchemy's
        transaction costs eight. Whatever goes wrong, the transaction is rolled back
        here, never left to the pool.
        """
        raw = await connection.get_raw_connection()
        driver: Any = raw.driver_connection
        try:
            if driver.isolation_level is None:
                # A host engine in driver-level autocommit: begin explicitly.
                await driver.execute_fetchall("BEGIN")
            # Otherwise the driver's implicit BEGIN opens the transaction.
            if not await driver.execute_fetchall(self._sql, self._positional(values)):
                await driver.rollback()
                return False
            await driver.execute_fetchall(then._sql, then._positional(values))
            await driver.commit()
            return True
        except BaseException:
            await driver.rollback()
            raise

    def _positional(self, values: dict[str, Any]) -> list[Any]:
        params = self._compiled.construct_params(values)
        return [params[name] for name in self._names]
