"""The leases facet of the memory store: held leases and their renewal; no presence,
and one clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

from jobrun._core import BootLease, HeldLease, is_leased, is_paused, not_watching
from jobrun._testing.memory.base import MemoryStoreBase


class MemoryLeases(MemoryStoreBase):
    """Held leases and their renewal; the presence and the clock's offset of a
    database that has neither."""

    async def extend_lease(
        self,
        run_id: str,
        token: str,
        expires_at: str,
        now_at: str,
        boot: BootLease | None = None,
    ) -> bool:
        if not self._held(run_id, token) or not is_leased(self.runs[run_id], now_at):
            return False
        if expires_at <= now_at:
            # A renewal to an expiry already past would hand the run to the next claimer.
            return False
        self.runs[run_id] = replace(
            self.runs[run_id],
            next_attempt_at=expires_at,
            lease_boot_id=None if boot is None else boot.boot_id,
            lease_boot_expires_ms=None if boot is None else boot.expires_ms,
        )
        return True

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> list[HeldLease]:
        return [
            HeldLease(
                row.id,
                row.module_id,
                row.job,
                cast(str, row.lease_owner),  # leased: never None
                row.lease_driver,
                row.lease_began_at,
            )
            for row in self.runs.values()
            if is_leased(row, now_at)
            and not is_paused(row)
            and (jobs is None or (row.module_id, row.job) in jobs)
        ]

    async def presence(self) -> int | None:
        return None

    def watch_presence(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        return not_watching

    def presence_fd(self, key: int | None) -> int | None:
        return None

    async def clock_offset_s(self) -> float:
        return 0.0
