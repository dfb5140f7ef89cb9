"""The leases facet of the SQL store: who holds which run, whether the holder is alive,
and the renewal of a held lease (``JobRunStore``; statements in
:mod:`jobrun.sql.statements.runs`).

On Postgres a holder's presence (:mod:`jobrun.sql.postgres.presence`) is the proof
of its death a takeover needs, and the database's clock is the one leases are
judged by when a driver claims on real time (:mod:`jobrun.sql.statements.clock`).
SQLite and memory have no presence, and one clock.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from jobrun._core import BootLease, HeldLease, not_watching, parse_instant
from jobrun._host import system_clock
from jobrun.sql.postgres.presence import Presence
from jobrun.sql.statements.clock import clock_statement
from jobrun.sql.statements.runs import held_leases_statement
from jobrun.sql.store.base import SqlStoreBase, fence_values, pairs

# How often the skew between this host's clock and Postgres's is measured again.
CLOCK_CHECK_INTERVAL_S = 60.0


class SqlLeases(SqlStoreBase):
    """Held leases and their renewal, the presence (Postgres), and how far the
    database's clock is from this host's."""

    _presence: Presence | None
    # (measured at, database clock minus system clock in seconds)
    _clock_offset: tuple[float, float] | None

    async def extend_lease(
        self,
        run_id: str,
        token: str,
        expires_at: str,
        now_at: str,
        boot: BootLease | None = None,
    ) -> bool:
        values = fence_values(run_id, token) | {"expires_at": expires_at, "now_at": now_at}
        # Postgres judges on its own clock: the boot columns stay NULL there.
        on_boot = boot is not None and not self._is_postgres
        values |= {
            "boot_id": boot.boot_id if on_boot and boot else None,
            "boot_expires_ms": boot.expires_ms if on_boot and boot else None,
        }
        if token in self._database_clock_leases:
            # Only the lease's length: Postgres judges and counts it on its own clock.
            lease = parse_instant(expires_at) - parse_instant(now_at)
            values = fence_values(run_id, token) | {"lease_ms": lease // timedelta(milliseconds=1)}
            statement = self._statements.extend_lease_on_database_clock
            return await self._lone_write("extend_lease", statement, values)
        return await self._lone_write("extend_lease", self._statements.extend_lease, values)

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> builtins.list[HeldLease]:
        values: dict[str, Any] = {"now_at": now_at}
        if jobs is not None:
            if not jobs:
                return []
            values |= pairs("", sorted(jobs))
        count = None if jobs is None else len(jobs)
        statement = self._shapes.of(held_leases_statement, count, self._presence is not None)
        async with self._operation("held_leases"):
            rows = await self._executor.fetch("held_leases", statement, values)
        return [HeldLease(*row) for row in rows]

    async def presence(self) -> int | None:
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.key()

    def watch_presence(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        if self._presence is None:
            return not_watching
        return self._presence.watch(key, lost)

    def presence_fd(self, key: int | None) -> int | None:
        return None if self._presence is None else self._presence.socket_fd(key)

    async def presence_connection(self) -> Any:
        """Postgres (asyncpg): the presence's own connection, which ``jobrun.worker``
        also LISTENs on; ``None`` elsewhere."""
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.connection()

    async def on_presence_connection(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        """Postgres: ``operation(raw)`` on the presence connection, one at a time
        with its liveness checks (``LISTEN`` goes through here)."""
        assert self._presence is not None, "only Postgres has a presence connection"
        async with self._operation("presence"):
            return await self._presence.on_connection(operation)

    async def held_leases_on_presence(
        self, now_at: str, jobs: frozenset[tuple[str, str]]
    ) -> builtins.list[HeldLease]:
        """Postgres: :meth:`held_leases` of ``jobs`` read on the presence connection,
        as an idle worker looks for dead holders (``jobrun.worker``): one round trip,
        no pool connection taken for it."""
        if not jobs:
            return []
        statement = self._shapes.of(held_leases_statement, len(jobs), True)
        arguments = statement.arguments({"now_at": now_at} | pairs("", sorted(jobs)))

        async def read(raw: Any) -> Any:
            return await raw.fetch(statement.sql, *arguments)

        return [HeldLease(*row) for row in await self.on_presence_connection(read)]

    async def clock_offset_s(self) -> float:
        if not self._is_postgres:
            return 0.0
        cached = self._clock_offset
        if cached is not None and time.monotonic() - cached[0] < CLOCK_CHECK_INTERVAL_S:
            return cached[1]
        statement = self._shapes.of(clock_statement)
        async with self._operation("clock_offset"):
            sent = system_clock().timestamp()
            found = await self._executor.fetch("clock_offset", statement, {})
            received = system_clock().timestamp()
        # The database read its clock about halfway through the round trip.
        offset = float(found[0][0].timestamp()) - (sent + received) / 2
        self._clock_offset = (time.monotonic(), offset)
        return offset
