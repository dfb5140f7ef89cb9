"""How the store's statements reach the database: compiled once, sent straight to the driver.

Every store operation goes through one executor, chosen when the store is built
from the engine's dialect; there is no other path. Statements are SQLAlchemy Core
constructs compiled once per store (:class:`Compiler`) into the driver's own SQL
text; at run time only the parameter list is built and the driver is called
(aiosqlite's ``execute_fetchall``, or ``execute`` for the step write, whose
answer is its change count; asyncpg's ``fetch``, which keeps a prepared
statement per connection and SQL text). SQLAlchemy's statement events therefore
never fire for these statements; :data:`StatementHook` is jobrun's own hook for
counting, tracing and fault injection, called around every statement sent,
``BEGIN`` and ``COMMIT`` included.

* SQLite: one connection per engine, checked out of the host's pool once (so its
  connect and checkout events run), detached from the pool's count and kept for
  the engine's life, in driver autocommit; operations take turns on it (an
  asyncio lock, kept even when nobody waits: it is what stops a lone statement
  from landing inside another operation's transaction). A lone statement, the
  step write among them, is one hop to aiosqlite's thread (``execute_fetchall``
  executes and fetches there in one call; ``execute`` executes and hands back
  the cursor, whose change count needs no hop), the same as the raw driver's own
  durable upsert, and is committed when it returns; a cancellation while it runs
  leaves nothing open, as a statement in autocommit is its own transaction. Its
  path is written flat (no hook wrapper without a hook, no context-manager
  layers): on SQLite the hop itself is only some 40 µs, so every µs of Python
  shows. A transaction is ``BEGIN IMMEDIATE``, its statements and ``COMMIT``; if
  anything interrupts it (an error, a cancellation) ``ROLLBACK`` is queued
  behind whatever the thread is still doing before the next operation gets its
  turn, so no transaction is ever left open. ``AsyncEngine.dispose()`` closes
  the connection.
* Postgres: connections checked out of the host's pool (its connect and checkout
  events run, its limits count them) and kept by jobrun between operations,
  shared by every store on the engine, per event loop; at most ``pool_size`` of
  them, each used by one operation at a time through its asyncpg connection.
  One goes back to the pool after ``IDLE_RETURN_S`` unused, or, while the pool
  has nothing left to give, every ``FULL_POOL_TURN_S`` (so the host's waiters get
  their turn). A lone statement runs outside any transaction, so it is one round
  trip and durable on return. A connection that saw an error or a cancellation
  is closed rather than kept, whatever state the server left it in; one the
  server closed while it was idle is replaced before use.
  ``AsyncEngine.dispose()`` closes them (:mod:`jobrun.sql.postgres.kept_connections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from sqlalchemy.engine import Dialect as SqlDialect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import SingletonThreadPool, StaticPool
from sqlalchemy.sql.expression import ClauseElement
from sqlalchemy.util import await_only

from jobrun._core import refuse
from jobrun.sql.postgres.kept_connections import (
    PostgresConnections,
    one_per_engine,
    postgres_connections_of,
)

StatementHook = Callable[[str, str, Sequence[Any]], AbstractAsyncContextManager[None]]
"""Called as ``async with hook(operation, sql, parameters):`` around every statement sent.

``operation`` is the store method (``"record_step"``, ``"commit_pass"``, ...);
``sql`` the statement's text as sent (``BEGIN IMMEDIATE``, ``COMMIT`` and
``ROLLBACK`` are statements too) and ``parameters`` its positional values.
Whatever the hook raises on entry stops the statement; on exit it sees the
statement's error, if any.
"""

Row = Sequence[Any]


class Prepared:
    """One statement compiled for one dialect: its SQL text and how to order its values."""

    __slots__ = ("_order", "sql")

    def __init__(self, sql: str, order: tuple[tuple[str, bool, Any], ...]) -> None:
        self.sql = sql
        # (name, taken from the caller's values?, else this fixed value)
        self._order = order

    def arguments(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] if given else fixed for name, given, fixed in self._order]

    def in_order(self, names: tuple[str, ...]) -> Prepared:
        """This statement, checked to take exactly ``names``, in that order, and
        nothing fixed: its callers may then pass their values as a list in that
        order (``fetch_in_order``), with no mapping built and none read."""
        found = tuple(name if given else None for name, given, _ in self._order)
        if found != names:
            raise TypeError(f"expected the parameters {names}, got {found}: {self.sql}")
        return self


class Compiler:
    """Compiles Core statements for one engine's dialect, in one place.

    ``schema_translate_map`` (if any) is rendered into the SQL text here, so a
    store on a non-default schema costs nothing more per statement.
    """

    def __init__(
        self, dialect: SqlDialect, schema_translate_map: Mapping[str | None, str] | None = None
    ) -> None:
        self._dialect = dialect
        self._schema_translate_map = dict(schema_translate_map or {})

    def __call__(self, statement: ClauseElement) -> Prepared:
        """Compile ``statement``, whose values are all bound parameters."""
        compiled: Any = statement.compile(
            dialect=self._dialect,
            schema_translate_map=self._schema_translate_map or None,
            render_schema_translate=bool(self._schema_translate_map),
        )
        if compiled.post_compile_params:
            # An IN list of values would be rendered per call: spell its parameters out.
            raise TypeError(f"jobrun statements are compiled once: {compiled.string}")
        if compiled._bind_processors:
            # Every column is TEXT or INTEGER: the drivers take Python values as they are.
            raise TypeError(f"jobrun statements need no bind processing: {compiled.string}")
        fixed = compiled.construct_params(_check=False)
        order = tuple(
            (name, name in compiled.binds and compiled.binds[name].required, fixed.get(name))
            for name in (compiled.positiontup or ())
        )
        return Prepared(compiled.string, order)


class _Executor:
    """What both executors share: the hook around each statement, and a statement
    sent on its own."""

    errors: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)

    def __init__(self, hook: StatementHook | None) -> None:
        self._hook = hook

    async def fetch(
        self, operation: str, statement: Prepared, values: Mapping[str, Any]
    ) -> list[Row]:
        """One statement on its own, outside any transaction: committed (durable) when it
        returns, in one round trip on Postgres; writes return their rows."""
        return await self.fetch_in_order(operation, statement, statement.arguments(values))

    async def fetch_in_order(
        self, operation: str, statement: Prepared, arguments: list[Any]
    ) -> list[Row]:
        raise NotImplementedError

    async def _send(self, driver: Any, operation: str, sql: str, arguments: list[Any]) -> list[Row]:
        if self._hook is None:
            return await self._driver_fetch(driver, sql, arguments)
        async with self._hook(operation, sql, arguments):
            return await self._driver_fetch(driver, sql, arguments)

    async def _driver_fetch(self, driver: Any, sql: str, arguments: list[Any]) -> list[Row]:
        raise NotImplementedError


class Session:
    """Statements inside one transaction (``Executor.transaction``)."""

    def __init__(self, executor: _Executor, driver: Any, operation: str) -> None:
        self._executor = executor
        self._driver = driver
        self._operation = operation

    async def fetch(self, statement: Prepared, values: Mapping[str, Any]) -> list[Row]:
        return await self._executor._send(
            self._driver, self._operation, statement.sql, statement.arguments(values)
        )


# --- SQLite --------------------------------------------------------------------------------


def _driver_autocommit(connection: Any) -> None:
    connection.connection.dbapi_connection.isolation_level = None


# How long ``dispose()`` waits for the thread of a connection given up on (see
# ``_SqliteConnection.abandon``) to finish.
ABANDONED_JOIN_S = 1.0


class _SqliteConnection:
    """The one aiosqlite connection jobrun uses on an engine, and whose turn it is."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self.driver: Any = None
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        # The last loop's lock, looked up without the weak dictionary (every statement asks).
        self._last_loop: Callable[[], asyncio.AbstractEventLoop | None] = lambda: None
        self._last_lock: asyncio.Lock | None = None
        # Connections given up on (``abandon``), kept referenced with what they still
        # have to do (a rollback): their thread may still be inside the call nobody
        # waits for any more.
        self.abandoned: list[tuple[AsyncConnection, Any, asyncio.Future[None] | None]] = []

    def lock(self) -> asyncio.Lock:
        """Whose turn it is, per event loop (an asyncio lock belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._last_loop() is loop and self._last_lock is not None:
            return self._last_lock
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        self._last_loop, self._last_lock = weakref.ref(loop), lock
        return lock

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[Any]:
        async with self.lock():
            yield self.driver if self.driver is not None else await self.open()

    async def open(self) -> Any:
        """Check the connection out of the host's pool and set it up; its driver."""
        connection = await self._engine.connect()
        try:
            raw = await connection.get_raw_connection()
            driver: Any = raw.driver_connection
            # Driver-level autocommit, set once while the connection is idle: a lone
            # statement commits itself; transactions say BEGIN and COMMIT.
            if driver.in_transaction:
                await driver.rollback()
            # Set through SQLAlchemy's adapter, which does it on aiosqlite's own thread:
            # aiosqlite's setter touches the sqlite3 object from this one, which a
            # connection made with check_same_thread (an in-memory database) refuses.
            await connection.run_sync(_driver_autocommit)
            if not isinstance(self._engine.sync_engine.pool, StaticPool | SingletonThreadPool):
                # Out of the pool's count, so the host keeps every connection it sized
                # the pool for. (A pool of one shared connection keeps it: that
                # connection is the database, in memory.)
                raw.detach()
        except BaseException:
            await connection.invalidate()
            await connection.close()
            raise
        self._connection, self.driver = connection, driver
        return driver

    def abandon(self, driver: Any, then: asyncio.Future[None] | None = None) -> bool:
        """Give up on ``driver`` after a call on it was cancelled: the next operation
        opens a fresh connection. Whether it was given up (a pool of one shared
        connection keeps it: that connection is the database, in memory).

        The call may still be running in the connection's thread (a thread blocked
        in the file system, say): nobody can end it from here. The connection is
        told to close once the thread is free (after ``then``, a rollback queued on
        it, if given) and is never used again, so whatever held it up holds up
        nothing else in this process.
        """
        if driver is not self.driver:
            return True  # given up on already
        pool = self._engine.sync_engine.pool
        if self._connection is None or isinstance(pool, StaticPool | SingletonThreadPool):
            return False
        self.abandoned.append((self._connection, driver, then))
        self._connection = self.driver = None
        if then is None:
            driver.stop()
        else:
            then.add_done_callback(lambda _done: driver.stop())
        return True

    def close(self) -> None:
        """Close the connection; called from ``Engine.dispose`` (inside SQLAlchemy's greenlet)."""
        abandoned, self.abandoned = self.abandoned, []
        for _connection, given_up, _then in abandoned:
            thread = getattr(given_up, "_thread", None)
            if thread is not None and thread.is_alive():
                # A moment for it to finish while this loop can still take its last
                # answers; a thread still blocked is left behind.
                await_only(asyncio.to_thread(thread.join, ABANDONED_JOIN_S))
        connection, driver = self._connection, self.driver
        self._connection = self.driver = None
        if connection is None:
            return
        # Not handed back (detached, or its pool is being disposed): closed for good.
        connection.sync_connection.invalidate()  # type: ignore[union-attr]
        await_only(driver.close())


_sqlite_connections: weakref.WeakKeyDictionary[Engine, _SqliteConnection] = (
    weakref.WeakKeyDictionary()
)


def _sqlite_connection_of(engine: AsyncEngine) -> _SqliteConnection:
    return one_per_engine(_sqlite_connections, engine, _SqliteConnection)


class SqliteExecutor(_Executor):
    errors = (SQLAlchemyError, OSError, sqlite3.Error)

    def __init__(self, engine: AsyncEngine, hook: StatementHook | None) -> None:
        super().__init__(hook)
        self._connection = _sqlite_connection_of(engine)

    async def fetch_in_order(
        self, operation: str, statement: Prepared, arguments: list[Any]
    ) -> list[Row]:
        """``fetch``, the values already a list in the statement's order.

        The step's path, so spelled out flat: the lock, then one call into
        aiosqlite's thread that executes and fetches (one hop there, one wake-up
        back), with no coroutine layers between (each costs a few tenths of a µs
        on the way down and again on every resume).
        """
        connection = self._connection
        async with connection.lock():
            driver = connection.driver
            if driver is None:
                driver = await connection.open()
            try:
                if self._hook is not None:
                    return await self._send(driver, operation, statement.sql, arguments)
                rows: list[Row] = await driver.execute_fetchall(statement.sql, arguments)
            except ValueError as error:
                raise sqlite3.OperationalError(str(error)) from error
            except asyncio.CancelledError:
                # Abandoned in flight (the pass's fence, say): the call may never end.
                connection.abandon(driver)
                raise
            return rows

    async def write_in_order(
        self, operation: str, statement: Prepared, arguments: list[Any]
    ) -> int:
        """A write without RETURNING on its own, committed when it returns: the
        rows it changed (sqlite3's ``rowcount``), flat as ``fetch_in_order``.

        aiosqlite's ``execute`` is one hop, as ``execute_fetchall`` is; its cursor
        is dropped unclosed (a write's statement is reset once done), since
        ``close`` would be a second hop.
        """
        connection = self._connection
        async with connection.lock():
            driver = connection.driver
            if driver is None:
                driver = await connection.open()
            try:
                hook = self._hook
                if hook is not None:
                    return await self._send_write(hook, driver, operation, statement, arguments)
                count: int = (await driver.execute(statement.sql, arguments)).rowcount
            except ValueError as error:
                raise sqlite3.OperationalError(str(error)) from error
            except asyncio.CancelledError:
                connection.abandon(driver)
                raise
            return count

    async def _send_write(
        self,
        hook: StatementHook,
        driver: Any,
        operation: str,
        statement: Prepared,
        arguments: list[Any],
    ) -> int:
        """``_send`` for ``write_in_order``: the hook around the same driver call."""
        async with hook(operation, statement.sql, arguments):
            try:
                count: int = (await driver.execute(statement.sql, arguments)).rowcount
            except ValueError as error:
                raise sqlite3.OperationalError(str(error)) from error
            return count

    @asynccontextmanager
    async def transaction(self, operation: str) -> AsyncIterator[Session]:
        async with self._connection.turn() as driver:
            try:
                # IMMEDIATE: the write lock (waiting out the busy timeout) before any read.
                await self._send(driver, operation, "BEGIN IMMEDIATE", [])
                yield Session(self, driver, operation)
                await self._send(driver, operation, "COMMIT", [])
            except BaseException as error:
                # Queued now, so it runs right after whatever the thread is still doing
                # and before the next turn's first statement; awaited under a shield so
                # that a second cancellation cannot release the turn before it is sent.
                rollback = asyncio.ensure_future(self._rollback(driver, operation))
                cancelled = isinstance(error, asyncio.CancelledError)
                if cancelled and self._connection.abandon(driver, then=rollback):
                    # Given up on, never used again (its thread may be stuck inside
                    # this transaction): the rollback, then the close, run whenever
                    # the thread is free; the next turn opens a fresh connection.
                    raise
                with contextlib.suppress(BaseException):
                    await asyncio.shield(rollback)
                raise

    async def _rollback(self, driver: Any, operation: str) -> None:
        with contextlib.suppress(sqlite3.Error):  # nothing open (BEGIN itself failed)
            await self._send(driver, operation, "ROLLBACK", [])

    def is_unique_violation(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.IntegrityError)

    async def _driver_fetch(self, driver: Any, sql: str, arguments: list[Any]) -> list[Row]:
        try:
            # A list already (sqlite3's fetchall): no copy.
            rows: list[Row] = await driver.execute_fetchall(sql, arguments)
            return rows
        except ValueError as error:
            # aiosqlite's word for a connection that was closed under it.
            raise sqlite3.OperationalError(str(error)) from error


# --- Postgres ------------------------------------------------------------------------------


class PostgresExecutor(_Executor):
    def __init__(self, engine: AsyncEngine, hook: StatementHook | None) -> None:
        super().__init__(hook)
        import asyncpg  # type: ignore[import-untyped]

        self._engine_connections = postgres_connections_of(engine)
        self._last: PostgresConnections | None = None
        self._unique_violation = asyncpg.UniqueViolationError
        self.errors = (
            SQLAlchemyError,
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError,
        )

    def _connections(self) -> PostgresConnections:
        # The last loop's set, remembered: a weak-dictionary look-up per statement costs more.
        found = self._last
        if found is None or found.closed or found.loop is not asyncio.get_running_loop():
            found = self._last = self._engine_connections.of_running_loop()
        return found

    @asynccontextmanager
    async def _kept(self) -> AsyncIterator[Any]:
        connections = self._connections()
        kept = await connections.acquire()
        try:
            yield kept.driver
        except BaseException as error:
            # A cancelled or failed statement may leave the server mid-query or
            # mid-transaction: this connection is closed, never used again.
            await connections.discard(kept, abandoned=not isinstance(error, Exception))
            raise
        connections.release(kept)

    async def fetch_in_order(
        self, operation: str, statement: Prepared, arguments: list[Any]
    ) -> list[Row]:
        """``fetch``, the values already a list in the statement's order."""
        # The step path: no context-manager layers (a few µs each), and an idle
        # connection taken without a coroutine when there is one.
        connections = self._connections()
        kept = connections.take_idle() or await connections.acquire()
        try:
            if self._hook is None:
                rows: list[Row] = await kept.driver.fetch(statement.sql, *arguments)
            else:
                rows = await self._send(kept.driver, operation, statement.sql, arguments)
        except BaseException as error:
            # Cancelled (abandoned at the pass's fence, say): its socket may be
            # silent for good, so it is cut, not closed politely.
            await connections.discard(kept, abandoned=not isinstance(error, Exception))
            raise
        connections.release(kept)
        return rows

    # The step write keeps RETURNING on Postgres (see ``_record_step``): its rows
    # are its answer, non-empty iff it applied.
    write_in_order = fetch_in_order

    @asynccontextmanager
    async def transaction(self, operation: str) -> AsyncIterator[Session]:
        async with self._kept() as driver:
            await self._send(driver, operation, "BEGIN", [])
            yield Session(self, driver, operation)
            await self._send(driver, operation, "COMMIT", [])
            # On any error the connection is closed, which ends the transaction.

    def is_unique_violation(self, error: BaseException) -> bool:
        return isinstance(error, self._unique_violation)

    async def _driver_fetch(self, driver: Any, sql: str, arguments: list[Any]) -> list[Row]:
        return list(await driver.fetch(sql, *arguments))


Executor = SqliteExecutor | PostgresExecutor


def executor_for(engine: AsyncEngine, hook: StatementHook | None) -> Executor:
    name, driver = engine.dialect.name, engine.dialect.driver
    if (name, driver) == ("sqlite", "aiosqlite"):
        return SqliteExecutor(engine, hook)
    if (name, driver) == ("postgresql", "asyncpg"):
        return PostgresExecutor(engine, hook)
    raise refuse(
        "engine",
        f"is {name}+{driver}, which jobrun does not support",
        message=f"jobrun supports sqlite+aiosqlite and postgresql+asyncpg, not {name}+{driver}",
    )
