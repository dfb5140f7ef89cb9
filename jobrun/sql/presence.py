"""Postgres: a driver process's presence, which the database ends when the process dies.

The presence is a session-level advisory lock on a random 63-bit key, held on
one connection of its own per store (made from a copy of the host's pool
configuration, so it never takes a connection from the host's pool). The key is
written into ``lease_driver`` by every claim (see ``jobrun._core.holders``).
When the process dies, however it dies, its socket closes, Postgres ends the
session and frees the lock: a claimer on any host that finds the key free in
``pg_locks`` has proof that the holder is gone. The connection idles: holding
the lock costs no query at all. The same connection carries the worker's
``LISTEN`` (see ``jobrun.worker``).

Should the connection be lost while the process lives (a network cut, a
Postgres restart, ``idle_session_timeout``), the leases it vouched for are
lost with it: other drivers may take them over, and the holder's fenced
writes are refused from then on. The next claim opens a new presence.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from sqlalchemy import BigInteger, case, column, event, func, literal, null, select, text
from sqlalchemy.exc import MissingGreenlet
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from jobrun.sql.schema import job_runs

# The advisory lock keys held in this database right now (a bigint key is split
# into classid, the high half, and objid, the low half, with objsubid 1).
_HELD_KEYS = (
    text(
        "SELECT (classid::bigint << 32) | objid::bigint AS key FROM pg_locks "
        "WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    .columns(column("key", BigInteger))
    .subquery("held_keys")
)


def presence_held() -> Any:
    """Per run row: whether the presence its ``lease_driver`` names is held
    (NULL when it names none)."""
    key = func.substring(job_runs.c.lease_driver, literal(r" presence=([0-9]+)\]$")).cast(
        BigInteger
    )
    return case(
        (key.is_(None), null()),
        else_=key.in_(select(_HELD_KEYS.c.key)),
    )


class Presence:
    """The presence of this process in one database, opened at first use."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._own: AsyncEngine | None = None
        self._connection: AsyncConnection | None = None
        self._raw: Any = None
        self._key: int | None = None
        self._opening = asyncio.Lock()
        event.listen(engine.sync_engine, "engine_disposed", self._on_dispose)

    def _alive(self) -> bool:
        return self._raw is not None and not self._raw.is_closed()

    async def key(self) -> int:
        """The advisory lock key this process holds, opening the presence if needed."""
        if not self._alive():
            async with self._opening:
                if not self._alive():
                    await self._open()
        assert self._key is not None
        return self._key

    async def connection(self) -> Any:
        """The presence's own asyncpg connection (for ``LISTEN``)."""
        await self.key()
        return self._raw

    async def _open(self) -> None:
        await self.close()
        if self._own is None:
            # A pool like the host's (same URL, connect arguments and events), not the host's.
            pool = self._engine.sync_engine.pool.recreate()
            self._own = create_async_engine(
                self._engine.url, pool=pool, isolation_level="AUTOCOMMIT"
            )
        key = secrets.randbits(63)
        connection = await self._own.connect()
        try:
            # Autocommit: the lock lives in the session, no transaction stays open.
            await connection.execute(select(func.pg_advisory_lock(key)))
            raw = (await connection.get_raw_connection()).driver_connection
        except BaseException:
            await connection.close()
            raise
        self._connection, self._raw, self._key = connection, raw, key

    async def close(self) -> None:
        connection, self._connection, self._raw, self._key = self._connection, None, None, None
        if connection is not None:
            try:
                await connection.close()
            except Exception:
                connection.sync_connection.invalidate()  # type: ignore[union-attr]
        if self._own is not None:
            own, self._own = self._own, None
            await own.dispose()

    def _on_dispose(self, _engine: Any) -> None:
        # The host disposed of its engine: let go of the presence with it. Called
        # inside SQLAlchemy's greenlet when the async engine is disposed.
        if self._connection is None and self._own is None:
            return
        closing = self.close()
        try:
            await_only(closing)
        except MissingGreenlet:
            closing.close()
            raw, self._raw, self._connection, self._own = self._raw, None, None, None
            if raw is not None:
                raw.terminate()
