"""The limit gate a step passes through: a rate-limit token whose turn passed while the
process slept is taken again, once at most."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import jobrun
from jobrun._core.engine.limit_gate import LimitGate
from jobrun._core.limits.buckets import stale_after_s
from jobrun.testing import FakeClock, MemoryJobRunStore


class _LateClock:
    """The gate's clock: a FakeClock whose sleeps end ``late_s`` after they should
    (a process that was not scheduled when its token came due)."""

    def __init__(self, fake: FakeClock, late_s: float) -> None:
        self.fake = fake
        self.late_s = late_s

    def monotonic(self) -> float:
        return self.fake.monotonic()

    def now(self) -> Any:
        return self.fake.now()

    async def sleep(self, seconds: float) -> None:
        self.fake.advance(seconds=seconds + self.late_s)


class _Takes:
    """A memory store that counts its takes."""

    def __init__(self, store: MemoryJobRunStore) -> None:
        self.store = store
        self.takes = 0

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        self.takes += 1
        return await self.store.take_token(key, per_second, burst)

    async def give_back_token(self, key: str, burst: int) -> None:
        await self.store.give_back_token(key, burst)


async def test_a_token_whose_turn_passed_while_the_process_slept_is_taken_again() -> None:
    fake = FakeClock()
    store = _Takes(MemoryJobRunStore(clock=fake))
    registry = jobrun.JobRegistry()
    # Declared burst 2: 1 at once, 1 kept back; a token is stale 50 ms after its instant.
    registry.rate_limit("api", per_second=10, burst=2)
    limits = registry.limits.for_step("call", "api", None)
    keeper = SimpleNamespace(fenced=lambda: False)
    on_time = LimitGate(registry.limits, store, _LateClock(fake, 0.0), keeper, "run")  # type: ignore[arg-type]
    await on_time.enter(limits, "call")  # the bucket's one token, at once
    await on_time.enter(limits, "call")  # the next, 100 ms later, slept on time
    assert store.takes == 2
    late = LimitGate(registry.limits, store, _LateClock(fake, 0.3), keeper, "run")  # type: ignore[arg-type]
    await late.enter(limits, "call")
    # Woken 300 ms after its token's instant: that token is not used, another is
    # reserved (here at once, the bucket having refilled meanwhile).
    assert store.takes == 4
    assert stale_after_s(10, 2) == pytest.approx(0.05)
    # Late within what is kept back (40 ms of 50): the token is used.
    slightly = LimitGate(registry.limits, store, _LateClock(fake, 0.04), keeper, "run")  # type: ignore[arg-type]
    await slightly.enter(limits, "call")
    assert store.takes == 5


async def test_a_token_is_taken_again_once_at_most() -> None:
    class AlwaysAWait(_Takes):
        async def take_token(self, key: str, per_second: float, burst: int) -> float:
            self.takes += 1
            return 0.1

    fake = FakeClock()
    store = AlwaysAWait(MemoryJobRunStore(clock=fake))
    registry = jobrun.JobRegistry()
    registry.rate_limit("api", per_second=10, burst=2)
    keeper = SimpleNamespace(fenced=lambda: False)
    late = LimitGate(registry.limits, store, _LateClock(fake, 0.3), keeper, "run")  # type: ignore[arg-type]
    await late.enter(registry.limits.for_step("call", "api", None), "call")
    # Stale twice: the second token is used anyway (a host this loaded would
    # otherwise throw every token away and send nothing).
    assert store.takes == 2
