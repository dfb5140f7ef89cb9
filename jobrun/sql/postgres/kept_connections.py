"""Postgres: the host-pool connections jobrun keeps between operations.

Checked out of the host's pool once (its connect and checkout events run, its
limits count them), used by one operation at a time, and handed back to the
pool when unused for ``IDLE_RETURN_S`` or, while the pool has nothing left to
give, every ``FULL_POOL_TURN_S``. Shared by every store on an engine, per event
loop; ``AsyncEngine.dispose()`` closes them. Why: ``docs/design.md``, "Round
trips". The executor (:mod:`jobrun.sql.executor`) is their only user.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import AssertionPool, QueuePool, SingletonThreadPool, StaticPool

# A kept connection unused this long goes back to the host's pool (checked in
# there, so the host's own code can have it again).
IDLE_RETURN_S = 1.0
# While the pool has nothing left to give, a kept connection goes back to it after
# its operation once it has been out this long: the host's own waiters wait for
# about this much, not for jobrun to fall idle.
FULL_POOL_TURN_S = 0.1
# How long what the pool's count said holds (so a connection goes back to a full
# pool at most this much later than FULL_POOL_TURN_S).
POOL_LOOK_S = 0.01
# How many connections jobrun keeps on an engine whose pool has no size (NullPool):
# SQLAlchemy's default pool size.
_UNSIZED_POOL_KEEPS = 5


class _Kept:
    """One connection checked out of the host's pool and kept busy by jobrun."""

    __slots__ = ("connection", "driver", "idle_since", "taken_at")

    def __init__(self, connection: AsyncConnection, driver: Any, taken_at: float) -> None:
        self.connection = connection
        self.driver = driver
        self.taken_at = taken_at
        self.idle_since = taken_at


class PostgresConnections:
    """The connections jobrun keeps on one engine in one event loop.

    Each is checked out of the host's pool once (its connect and checkout events
    run, its limits count it) and used for one operation at a time; between
    operations it waits here, not in the pool, and goes back to the pool after
    ``IDLE_RETURN_S`` unused (or every ``FULL_POOL_TURN_S`` while the pool has
    nothing left to give). At most ``limit`` are out at once; further operations
    wait for one to come free.
    """

    def __init__(self, engine: AsyncEngine, limit: int, capacity: int | None) -> None:
        self._engine = engine
        self._limit = limit
        self._capacity = capacity
        self._pool: Any = engine.sync_engine.pool
        self._recycle_s: float = self._pool._recycle
        self.loop = self._loop = asyncio.get_running_loop()
        self._idle: list[_Kept] = []  # the most recently used last
        self._out = 0  # checked out of the pool: in use, idle, or being opened
        self._waiters: collections.deque[asyncio.Future[_Kept | None]] = collections.deque()
        self._returner: asyncio.TimerHandle | None = None
        self._returning: set[asyncio.Task[None]] = set()
        self._pool_looked_at = -POOL_LOOK_S
        self._pool_was_full = False
        self.closed = False

    def limit_to(self, limit: int) -> None:
        """From now on at most ``limit`` out (those out past it go back as they come free)."""
        self._limit = limit

    def take_idle(self) -> _Kept | None:
        """An idle connection still open, at once, or ``None`` (then ``acquire``):
        the step's path, which usually finds one, needs no coroutine for it."""
        idle = self._idle
        if idle and not idle[-1].driver.is_closed():
            return idle.pop()
        return None

    async def acquire(self) -> _Kept:
        idle = self._idle
        while idle:
            kept = idle.pop()
            if not kept.driver.is_closed():
                return kept
            # Ended while idle (a server restart, pg_terminate_backend): replaced.
            await self.discard(kept)
        if self._out < self._limit:
            self._out += 1
            return await self._take()
        waiter: asyncio.Future[_Kept | None] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            kept_or_turn = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Handed over just as this waiter was cancelled: pass it on.
                handed = waiter.result()
                if handed is None:
                    self._out -= 1
                self._hand_on(handed)
            raise
        if kept_or_turn is None:
            return await self._take()  # a slot came free: ours to open
        return kept_or_turn

    async def _take(self) -> _Kept:
        """Check a connection out of the host's pool (this slot is already counted)."""
        try:
            connection = await self._engine.connect()
            try:
                driver: Any = (await connection.get_raw_connection()).driver_connection
                if driver.is_in_transaction():
                    # A host event ran a statement outside autocommit: rolled back as
                    # the pool would at check-in, or jobrun's writes would sit in it.
                    await connection.run_sync(_roll_back_driver)
            except BaseException:
                await asyncio.shield(connection.invalidate())
                await asyncio.shield(connection.close())
                raise
        except BaseException:
            self._out -= 1
            self._hand_on(None)
            raise
        return _Kept(connection, driver, self._loop.time())

    def release(self, kept: _Kept) -> None:
        """Back after an operation that went well: to a waiter, or kept idle."""
        if self.closed:
            # Its engine was disposed while it was in use: closed, not handed back
            # to a pool that is gone.
            self._out -= 1
            self._in_task(self._close(kept))
            return
        if self._out > self._limit and not self._waiters:
            # The limit was lowered while this was out (keep_at_most on an engine in use).
            self._out -= 1
            self._in_task(self._check_in(kept))
            return
        now = self._loop.time()
        if (
            now - kept.taken_at >= FULL_POOL_TURN_S
            and self._capacity is not None
            and self._pool_full(now)
        ):
            # The pool has nothing left to give: checked back in now and then, so
            # whoever waits for it (the host too) gets it in turn.
            self._out -= 1
            self._in_task(self._check_in(kept))
            self._hand_on(None)
            return
        if self._waiters:
            self._hand_on(kept)
            return
        kept.idle_since = now
        self._idle.append(kept)
        if self._returner is None:
            self._returner = self._loop.call_later(IDLE_RETURN_S, self._return_idle)

    def _pool_full(self, now: float) -> bool:
        """Whether the host's pool has nothing left to give, looked at no more than
        once per ``POOL_LOOK_S`` (the pool's count costs a µs, and every operation
        of a connection kept past ``FULL_POOL_TURN_S`` asks)."""
        if now - self._pool_looked_at >= POOL_LOOK_S:
            self._pool_looked_at = now
            self._pool_was_full = self._pool.checkedout() >= (self._capacity or 0)
        return self._pool_was_full

    def _hand_on(self, kept: _Kept | None) -> None:
        """Give a connection, or with ``None`` a free slot (theirs to open), to the
        first waiter still waiting."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                if kept is None:
                    self._out += 1
                waiter.set_result(kept)
                return
        if kept is not None:
            self.release(kept)

    async def discard(self, kept: _Kept, abandoned: bool = False) -> None:
        """Close a connection that saw an error or a cancellation; never reused.

        Whatever the server was doing on it (a statement, a transaction) ends
        with the connection; the pool forgets it and opens a new one when asked.
        ``abandoned`` (a call cancelled unanswered, at a pass's fence say): closed
        in the background, so the caller waits on no I/O; the close asks the
        server to cancel the statement (asyncpg's cancel request goes on a
        connection of its own) and gives a socket that never answers again at
        most 2 s before cutting it (SQLAlchemy's invalidation).
        """
        self._out -= 1
        self._hand_on(None)
        if abandoned:
            self._in_task(self._close(kept))
            return
        await self._close(kept)

    @staticmethod
    async def _close(kept: _Kept) -> None:
        with contextlib.suppress(Exception):
            await asyncio.shield(kept.connection.invalidate())
        with contextlib.suppress(Exception):
            await asyncio.shield(kept.connection.close())

    def _return_idle(self) -> None:
        """Hand back to the pool what sat unused too long, or was out past the pool's
        recycle time (so the pool replaces it)."""
        self._returner = None
        now = self._loop.time()
        keep: list[_Kept] = []
        for kept in self._idle:
            unused = now - kept.idle_since >= IDLE_RETURN_S
            stale = 0 <= self._recycle_s < now - kept.taken_at
            if unused or stale:
                self._out -= 1
                self._in_task(self._check_in(kept))
            else:
                keep.append(kept)
        self._idle = keep
        if keep:
            # The list is in the order the connections came back: the first is due first.
            due_in_s = keep[0].idle_since + IDLE_RETURN_S - now
            self._returner = self._loop.call_later(due_in_s, self._return_idle)

    def _in_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self._returning.add(task)  # held, so it is not collected before it ends
        task.add_done_callback(self._returning.discard)

    @staticmethod
    async def _check_in(kept: _Kept) -> None:
        try:
            await kept.connection.close()
        except Exception:
            kept.driver.terminate()

    def close(self) -> None:
        """Close every idle connection now (``Engine.dispose``, in SQLAlchemy's
        greenlet); those in use are closed when their operation ends."""
        self.closed = True
        if self._returner is not None:
            self._returner.cancel()
            self._returner = None
        idle, self._idle = self._idle, []
        self._out -= len(idle)
        same_loop = _running_loop() is self._loop
        for kept in idle:
            if same_loop:
                # Inside the disposing greenlet: closed properly, and the pool
                # forgets it.
                kept.connection.sync_connection.invalidate()  # type: ignore[union-attr]
            else:
                # Another event loop's connection: cut without I/O on this loop (and
                # detached first, so the pool neither closes nor misses it).
                with contextlib.suppress(Exception):
                    kept.connection.sync_connection.connection.detach()  # type: ignore[union-attr]
                    kept.driver.terminate()
        while self._waiters:
            # Each opens a connection of its own, handed back when its operation ends.
            self._hand_on(None)


def _roll_back_driver(connection: Any) -> None:
    connection.connection.dbapi_connection.rollback()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_keep_limits: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()


def keep_at_most(engine: AsyncEngine, limit: int) -> None:
    """At most ``limit`` connections out at once on ``engine``, whatever its pool (the
    worker's ``max_connections_per_database``, on its own engines and those handed in).
    An engine already in use keeps those it has out, and takes no more past ``limit``."""
    _keep_limits[engine.sync_engine] = limit
    found = _postgres_connections.get(engine.sync_engine)
    if found is not None:
        found.limit_to(limit)


class _PostgresEngineConnections:
    """Per engine, shared by all its stores: the kept connections of each event loop."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        pool: Any = engine.sync_engine.pool
        # What the pool can have out at once (None: no bound, as with NullPool).
        self.capacity: int | None = None
        self.limit = _UNSIZED_POOL_KEEPS
        if isinstance(pool, QueuePool):
            overflow = pool._max_overflow
            self.capacity = None if overflow < 0 else pool.size() + overflow
            # One short of a full pool where the pool allows, so that jobrun alone
            # does not leave the host waiting (nor itself handing connections back).
            self.limit = max(1, min(pool.size(), (self.capacity or pool.size() + 1) - 1))
        elif isinstance(pool, StaticPool | SingletonThreadPool | AssertionPool):
            self.limit = 1  # one connection in all: never two operations on it at once
        self.limit = _keep_limits.get(engine.sync_engine, self.limit)
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PostgresConnections] = (
            weakref.WeakKeyDictionary()
        )

    def limit_to(self, limit: int) -> None:
        self.limit = limit
        for connections in list(self._by_loop.values()):
            connections.limit_to(limit)

    def of_running_loop(self) -> PostgresConnections:
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None or found.closed:
            found = self._by_loop[loop] = PostgresConnections(
                self._engine, self.limit, self.capacity
            )
        return found

    def close(self) -> None:
        by_loop, self._by_loop = self._by_loop, weakref.WeakKeyDictionary()
        for connections in list(by_loop.values()):
            connections.close()


class _Closable(Protocol):
    def close(self) -> None: ...


Kept = TypeVar("Kept", bound=_Closable)


def one_per_engine(
    registry: weakref.WeakKeyDictionary[Engine, Kept],
    engine: AsyncEngine,
    make: Callable[[AsyncEngine], Kept],
) -> Kept:
    """The connections jobrun keeps on ``engine`` (made on first use), closed by ``dispose()``."""
    sync_engine = engine.sync_engine
    found = registry.get(sync_engine)
    if found is None:
        found = registry[sync_engine] = make(engine)
        # Weakly: the listener must not keep the connections alive after the engine.
        closer = weakref.ref(found)

        def on_dispose(_engine: Engine) -> None:
            alive = closer()
            if alive is not None:
                alive.close()

        event.listen(sync_engine, "engine_disposed", on_dispose)
    return found


_postgres_connections: weakref.WeakKeyDictionary[Engine, _PostgresEngineConnections] = (
    weakref.WeakKeyDictionary()
)


def postgres_connections_of(engine: AsyncEngine) -> _PostgresEngineConnections:
    return one_per_engine(_postgres_connections, engine, _PostgresEngineConnections)
