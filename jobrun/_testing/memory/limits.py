"""The limits facet of the memory store: rate-limit buckets and concurrency slots,
by the arithmetic of :mod:`jobrun._core.limits.buckets` on the store's clock.
"""

from __future__ import annotations

import builtins
import math
from datetime import datetime, timedelta
from typing import Any

from jobrun._core import (
    MILLI,
    BootInstant,
    LimitUsage,
    bucket_cap_milli,
    bucket_state,
    format_instant,
    slot_counts,
    take,
)
from jobrun._testing.memory.base import MemoryStoreBase


class MemoryLimits(MemoryStoreBase):
    """Tokens, slots, cooling a limit down and the limits' usage."""

    # key: [milli-tokens, refilled at, per_second, burst]
    buckets: dict[str, builtins.list[Any]]
    # key: (cooling down until, why), from RetryAfter(rate_limit=key)
    cooling: dict[str, tuple[datetime, str]]
    # (key, run id, step, lease token)
    slots: set[tuple[str, str, str, str]]

    def _refill(self, key: str, per_second: float, burst: int) -> builtins.list[Any]:
        now = self._clock.now()
        bucket = self.buckets.setdefault(key, [bucket_cap_milli(burst), now, per_second, burst])
        bucket[2:] = [per_second, burst]
        return bucket

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        bucket = self._refill(key, per_second, burst)
        now = self._clock.now()
        elapsed_ms = (now - bucket[1]).total_seconds() * 1000
        bucket[0], wait_s = take(bucket[0], elapsed_ms, per_second, burst)
        bucket[1] = max(bucket[1], now)
        if key in self.limit_pauses:
            return math.inf
        # A bucket cooling down refills from a later instant.
        return float(wait_s + max(0.0, (bucket[1] - now).total_seconds()))

    async def cool_limit(
        self, key: str, per_second: float, burst: int, seconds: float, reason: str
    ) -> None:
        bucket = self._refill(key, per_second, burst)
        until = self._clock.now() + timedelta(seconds=seconds)
        if bucket[1] < until:
            bucket[0], bucket[1] = MILLI, until
            self.cooling[key] = (until, reason)

    async def give_back_token(self, key: str, burst: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is not None:
            bucket[0] = min(bucket_cap_milli(burst), bucket[0] + MILLI)

    def _cooling_of(self, key: str, now: datetime) -> tuple[str | None, str | None]:
        found = self.cooling.get(key)
        if found is None or found[0] <= now:
            return None, None
        return format_instant(found[0]), found[1]

    def _counting(
        self, key: str, now_at: str, boot: BootInstant | None = None
    ) -> builtins.list[tuple[str, str, str, str]]:
        return [
            slot
            for slot in self.slots
            if slot[0] == key and slot_counts(self.runs.get(slot[1]), slot[3], now_at, boot)
        ]

    async def acquire_slot(
        self,
        key: str,
        most: int,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> bool:
        if key in self.limit_pauses or len(self._counting(key, now_at, boot)) >= most:
            return False
        self.slots.add((key, run_id, step, token))
        return True

    async def release_slot(
        self,
        key: str,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> None:
        counting = set(self._counting(key, now_at, boot))
        self.slots = {
            slot
            for slot in self.slots
            if slot[0] != key or (slot in counting and slot != (key, run_id, step, token))
        }

    async def limit_usage(self, now_at: str) -> LimitUsage:
        now = self._clock.now()
        buckets = tuple(
            bucket_state(
                key,
                rate,
                burst,
                tokens,
                (now - refilled_at).total_seconds() * 1000,
                *self._cooling_of(key, now),
            )
            for key, (tokens, refilled_at, rate, burst) in sorted(self.buckets.items())
        )
        held: dict[str, int] = {}
        for key in sorted({slot[0] for slot in self.slots}):
            if counted := len(self._counting(key, now_at)):
                held[key] = counted
        return LimitUsage(buckets, held)
