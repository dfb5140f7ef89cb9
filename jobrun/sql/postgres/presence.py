"""Postgres: a driver process's presence, which the database ends when the process dies.

The presence is a session-level advisory lock on a random 63-bit key, held on
one connection of its own per store (made from a copy of the host's pool
configuration, so it never takes a connection from the host's pool). The key is
written into ``lease_driver`` by every claim (see ``jobrun._core.leases.holders``).
When the process dies, however it dies, its socket closes, Postgres ends the
session and frees the lock: a claimer on any host that finds the key free in
``pg_locks`` has proof that the holder is gone. The connection idles: holding
the lock costs no query at all. The same connection carries the worker's
``LISTEN`` (see ``jobrun.worker``).

A session that ended is not proof that its process did: a network cut, a
Postgres restart or a proxy end the sessions of live processes. So a claimer
that finds the lock free waits ``PRESENCE_GRACE_S`` before it takes the runs
over (see ``jobrun._core.leases.proof_of_death``), and the holder keeps its side of that
bargain here: the session is told never to time out when idle
(``idle_session_timeout = 0``, which a server or role setting would otherwise
apply), and a round trip on it every ``PRESENCE_CHECK_INTERVAL_S``, allowed
``PRESENCE_CHECK_TIMEOUT_S``, both keeps it busy and proves it is still there.
When a check fails the presence is *lost*: the watchers of its key are told at
once (the lease keepers cancel the passes it vouched for), the connection is
closed, and the next claim opens a new presence under a new key.

A free lock proves death only on the server where the lock was taken. Advisory
locks are not replicated: on a replica promoted to primary every presence of
the old primary looks free, and the old primary may still be running their
holders (split brain). So the top bits of a key name the server it was taken on
(``SERVER_TAG_BITS``: eight bits of its system identifier's hash, eight of its
timeline, which a promotion increments); a lease whose presence was taken under
another tag proves nothing here (``presence_held`` is NULL), and its run waits
for its lease to expire, or for a same-host proof by pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    case,
    column,
    event,
    func,
    literal,
    literal_column,
    null,
    select,
    text,
)
from sqlalchemy.exc import MissingGreenlet
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from jobrun._core import (
    PRESENCE_APPLICATION,
    PRESENCE_CHECK_INTERVAL_S,
    PRESENCE_CHECK_TIMEOUT_S,
    PRESENCE_PATTERN,
    not_watching,
)
from jobrun.sql.schema import job_runs

log = logging.getLogger("jobrun.presence")

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


# Whether this session holds advisory lock ``$1`` (the presence's check). A plain
# round trip would prove a connection, not the lock: behind a pooler in
# transaction mode (PgBouncer) the lock stays on whichever server session took it,
# which may end while the client's own connection, and a ``SELECT 1``, go on.
_HOLDS_KEY = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND objsubid = 1 AND pid = pg_backend_pid() "
    "AND ((classid::bigint << 32) | objid::bigint) = $1)"
)


class PresenceNotHeld(Exception):
    """The presence's lock is not held by the session it was taken on."""

    def __init__(self) -> None:
        super().__init__(
            "the presence's advisory lock is not held by this session: is a pooler in "
            "transaction mode (such as PgBouncer) between jobrun and Postgres? Workers "
            "must connect directly or through session pooling "
            "(docs/explanation/scaling-out.md)"
        )


def application_name() -> str:
    """What a presence session calls itself (``pg_stat_activity.application_name``):
    ``jobrun presence host=<node> pid=<pid>``, within Postgres's 63 bytes."""
    name = f"{PRESENCE_APPLICATION} host={os.uname().nodename} pid={os.getpid()}"
    return name.encode("utf-8")[:63].decode("utf-8", "ignore")


def live_presences_statement() -> Any:
    """Every presence held in this database now: its key, the session's application
    name, client address and when it began (as text, UTC)."""
    return text(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint, a.application_name, "
        "host(a.client_addr), "
        """to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') """
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND a.application_name LIKE :application ORDER BY a.backend_start"
    ).bindparams(application=PRESENCE_APPLICATION + " %")


# A presence key: a server tag in its top bits, random bits below (63 in all,
# so that it stays a positive bigint).
SERVER_TAG_BITS = 16
_RANDOM_BITS = 63 - SERVER_TAG_BITS

# This server's tag: its system identifier (another cluster) and its timeline (the
# same cluster, promoted since), eight bits each; the timeline counts as 0 on a
# replica still in recovery (``pg_current_wal_lsn`` needs a primary).
_SERVER_TAG = (
    "(((hashtext((SELECT system_identifier FROM pg_control_system())::text) & 255) << 8)"
    " | CASE WHEN pg_is_in_recovery() THEN 0 ELSE ('x' || "
    "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int & 255 END)::bigint"
)


def presence_held() -> Any:
    """Per run row: whether the presence its ``lease_driver`` names is held (NULL when
    it names none, or one taken under another server tag: its lock's absence here
    proves nothing)."""
    key = func.substring(job_runs.c.lease_driver, literal(PRESENCE_PATTERN)).cast(BigInteger)
    this_server = literal_column(_SERVER_TAG, BigInteger)
    return case(
        (key.is_(None), null()),
        (key.op(">>")(literal_column(str(_RANDOM_BITS))).is_distinct_from(this_server), null()),
        else_=key.in_(select(_HELD_KEYS.c.key)),
    )


async def _new_key(raw: Any) -> int:
    """A fresh presence key under this server's tag."""
    tag = int(await raw.fetchval(f"SELECT {_SERVER_TAG}"))
    return (tag << _RANDOM_BITS) | secrets.randbits(_RANDOM_BITS)


class Presence:
    """The presence of this process in one database, opened at first use."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._own: AsyncEngine | None = None
        self._connection: AsyncConnection | None = None
        self._raw: Any = None
        self._key: int | None = None
        self._opening = asyncio.Lock()
        # One operation at a time on the connection: the checks and the worker's LISTEN.
        self._busy = asyncio.Lock()
        self._checker: asyncio.Task[None] | None = None
        self._watchers: dict[int, Callable[[], None]] = {}
        self._next_watch = 0
        self._discarding: asyncio.Future[None] | None = None
        event.listen(engine.sync_engine, "engine_disposed", self._on_dispose)

    def _alive(self) -> bool:
        return self._raw is not None and not self._raw.is_closed()

    async def key(self) -> int:
        """The advisory lock key this process holds, opening the presence if needed."""
        if not self._alive():
            async with self._opening:
                if not self._alive():
                    # Bounded by the drive's call around it (drive.within, issue 31).
                    await self._open()
        assert self._key is not None
        return self._key

    async def connection(self) -> Any:
        """The presence's own asyncpg connection (for the termination listener)."""
        await self.key()
        return self._raw

    async def on_connection(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``operation(raw)`` on the presence connection, never beside a check
        (asyncpg runs one operation at a time per connection)."""
        raw = await self.connection()
        async with self._busy:
            return await operation(raw)

    def watch(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        """Call ``lost`` once when presence ``key`` is lost (at once if it is not
        the live presence now); returns what stops the watching."""
        if key is None:
            return not_watching
        if key != self._key or not self._alive():
            lost()
            return not_watching
        self._next_watch += 1
        number = self._next_watch
        self._watchers[number] = lost

        def stop() -> None:
            self._watchers.pop(number, None)

        return stop

    def socket_fd(self, key: int | None) -> int | None:
        """The socket of the presence connection, if ``key`` is the live presence."""
        if key is None or key != self._key or not self._alive():
            return None
        # asyncpg keeps its transport private; without it the watchdog watches the lease only.
        transport = getattr(self._raw, "_transport", None)
        sock = None if transport is None else transport.get_extra_info("socket")
        return None if sock is None else int(sock.fileno())

    async def _open(self) -> None:
        await self.close()
        if self._own is None:
            # A pool like the host's (same URL, connect arguments and events), not the host's.
            pool = self._engine.sync_engine.pool.recreate()
            self._own = create_async_engine(
                self._engine.url, pool=pool, isolation_level="AUTOCOMMIT"
            )
        connection = await self._own.connect()
        try:
            raw = (await connection.get_raw_connection()).driver_connection
            await _keep_session(raw)
            key = await _new_key(raw)
            # Autocommit: the lock lives in the session, no transaction stays open.
            await connection.execute(select(func.pg_advisory_lock(key)))
            await _check_held(raw, key)
        except BaseException:
            # Not politely: the failure may be a socket that never answers.
            await asyncio.shield(_discard(connection))
            raise
        self._connection, self._raw, self._key = connection, raw, key
        self._checker = asyncio.get_running_loop().create_task(self._check_forever(raw, key))

    async def _check_forever(self, raw: Any, key: int) -> None:
        """Prove the session is there, still holding the lock, every interval while it
        vouches for a pass; on the first failure, lose it. With nothing watched no
        query is sent (an idle host stays silent): a pass's lease names a token
        newer than any look a claimer took, so its grace starts after the watch,
        and the first check comes within one interval of it."""
        while raw is self._raw:
            await asyncio.sleep(PRESENCE_CHECK_INTERVAL_S)
            if not self._watchers:
                continue
            try:
                async with asyncio.timeout(PRESENCE_CHECK_TIMEOUT_S), self._busy:
                    await _check_held(raw, key)
            except Exception as error:
                if raw is self._raw:
                    log.warning("lost this process's presence in the database: %r", error)
                    self._lose(raw)
                return

    def _detach(self) -> tuple[AsyncConnection | None, Any]:
        """Forget the presence, telling its watchers it is gone; what it held."""
        held = self._connection, self._raw
        self._connection, self._raw, self._key = None, None, None
        watchers, self._watchers = self._watchers, {}
        for lost in watchers.values():
            lost()
        return held

    def _lose(self, raw: Any) -> None:
        """The session is gone (or unreachable): tell the watchers, drop the connection."""
        self._checker = None
        with contextlib.suppress(Exception):
            raw.terminate()
        connection, _ = self._detach()
        if connection is not None:
            # Given back to its pool as invalid (not left for the garbage collector).
            self._discarding = asyncio.ensure_future(_discard(connection))

    async def close(self) -> None:
        checker, self._checker = self._checker, None
        if checker is not None and checker is not asyncio.current_task():
            checker.cancel()
        connection, raw = self._detach()
        if connection is not None:
            # Cut first: an idle presence is not checked, so its socket may have gone
            # silent unnoticed (a lossy path), and a polite close, here or when its
            # pool is disposed, would wait on it for ever (issue 31). The session
            # ends as at a process's death, which is what presence is about.
            with contextlib.suppress(Exception):
                raw.terminate()
            try:
                await connection.close()
            except Exception:
                connection.sync_connection.invalidate()  # type: ignore[union-attr]
        elif raw is not None:
            raw.terminate()
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
            if self._checker is not None:
                self._checker.cancel()
                self._checker = None
            if raw is not None:
                raw.terminate()


async def _check_held(raw: Any, key: int) -> None:
    if not await raw.fetchval(_HOLDS_KEY, key):
        raise PresenceNotHeld()


async def _discard(connection: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.invalidate()
    with contextlib.suppress(Exception):
        await connection.close()


async def _keep_session(raw: Any) -> None:
    """Settings that would end an idle session of a live process are turned off for
    this one (Postgres 14 added ``idle_session_timeout``); TCP keepalives are
    shortened so that the server, too, notices a peer cut off by the network."""
    version = int(await raw.fetchval("SHOW server_version_num"))
    if version >= 140000:
        await raw.execute("SET idle_session_timeout = 0")
    # Named, so the console's workers page finds the live drivers holding no lease.
    await raw.execute("SELECT set_config('application_name', $1, false)", application_name())
    await raw.execute(
        "SET idle_in_transaction_session_timeout = 0; SET statement_timeout = 0; "
        "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; "
        "SET tcp_keepalives_count = 3"
    )
