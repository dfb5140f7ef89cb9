"""Rate and concurrency limit declarations, and the token bucket's arithmetic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import jobrun
from jobrun._core.engine.limit_gate import LimitGate
from jobrun._core.limits.buckets import (
    MILLI,
    bucket_state,
    rate_limit_of_deferral,
    refilled,
    spent_at_once,
    stale_after_s,
    take,
    too_long_a_wait,
    wait_for_token_s,
)
from jobrun._core.limits.declarations import Pacer
from jobrun.testing import FakeClock, MemoryJobRunStore


def test_the_same_declaration_twice_is_accepted_and_another_refused() -> None:
    registry = jobrun.JobRegistry()
    registry.rate_limit("api.example.com", per_second=50, burst=5)
    registry.rate_limit("api.example.com", per_second=50, burst=5)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=40, burst=5)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=50, burst=6)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=50, burst=5, store=object())
    registry.concurrency_limit("tenant-", 3)
    registry.concurrency_limit("tenant-", 3)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.concurrency_limit("tenant-", 4)


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"key": "k", "per_second": 0, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": -1.5, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": float("inf"), "burst": 1}, "per_second"),
        ({"key": "k", "per_second": float("nan"), "burst": 1}, "per_second"),
        ({"key": "k", "per_second": True, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": "50", "burst": 1}, "per_second"),
        ({"key": "k", "per_second": 1, "burst": 0}, "burst"),
        ({"key": "k", "per_second": 1, "burst": True}, "burst"),
        ({"key": "k", "per_second": 1, "burst": 1.5}, "burst"),
        ({"key": "k", "per_second": 1, "burst": 10**7}, "burst"),
        ({"key": 7, "per_second": 1, "burst": 1}, "key"),
        ({"key": "", "per_second": 1, "burst": 1}, "key"),
        ({"key": "a\x00b", "per_second": 1, "burst": 1}, "key"),
    ],
)
def test_a_bad_rate_limit_is_refused(arguments: dict[str, object], path: str) -> None:
    registry = jobrun.JobRegistry()
    key = arguments.pop("key")
    with pytest.raises(jobrun.JobValidationError) as refused:
        # Wrong types on purpose: the refusal is what is tested.
        registry.rate_limit(key, **arguments)  # type: ignore[arg-type]
    assert refused.value.errors[0]["path"] == path
    assert registry.limits.rates == {}


@pytest.mark.parametrize(
    ("prefix", "most", "path"),
    [
        ("tenant-", 0, "most"),
        ("tenant-", True, "most"),
        ("tenant-", 2.0, "most"),
        ("", 1, "prefix"),
        (None, 1, "prefix"),
        (b"tenant-", 1, "prefix"),
    ],
)
def test_a_bad_concurrency_limit_is_refused(prefix: object, most: object, path: str) -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError) as refused:
        # Wrong types on purpose: the refusal is what is tested.
        registry.concurrency_limit(prefix, most)  # type: ignore[arg-type]
    assert refused.value.errors[0]["path"] == path


def test_the_longest_declared_prefix_wins_and_an_unmatched_key_is_a_mistake() -> None:
    registry = jobrun.JobRegistry()
    registry.concurrency_limit("tenant-", 3)
    registry.concurrency_limit("tenant-vip-", 10)
    limits = registry.limits
    assert limits.for_step("s", None, "tenant-7").concurrency == registry.limits.prefixes["tenant-"]
    vip = limits.for_step("s", None, "tenant-vip-1")
    assert (vip.concurrency_key, vip.concurrency and vip.concurrency.most) == ("tenant-vip-1", 10)
    with pytest.raises(jobrun.HandlerMistakeError, match="matches no declared prefix"):
        limits.for_step("s", None, "customer-7")
    with pytest.raises(jobrun.HandlerMistakeError, match="must be a str"):
        limits.for_step("s", None, 7)
    with pytest.raises(jobrun.HandlerMistakeError, match="is not declared"):
        limits.for_step("s", "api", None)
    assert not limits.for_step("s", None, None).any


def test_a_bucket_refills_whole_milli_tokens_up_to_what_it_spends_at_once() -> None:
    # 50/s is 50 milli-tokens a millisecond.
    assert refilled(0, 20, 50.0, 5) == 1000
    # Declared burst 5: 3 at once, 2 kept back for the jitter at the API.
    assert refilled(0, 10_000, 50.0, 5) == 3 * MILLI
    assert [spent_at_once(burst) for burst in (1, 2, 3, 4, 5, 10)] == [1, 1, 2, 2, 3, 5]
    # A fraction of a milli-token is dropped, never rounded up.
    assert refilled(0, 1, 0.5, 5) == 0
    assert refilled(0, 3, 0.5, 5) == 1
    # A clock that went back adds nothing.
    assert refilled(-2000, -50, 50.0, 5) == -2000


def test_a_take_reserves_and_says_how_long_to_wait() -> None:
    assert take(3 * MILLI, 0, 50.0, 5) == (2 * MILLI, 0.0)
    after, wait_s = take(0, 0, 50.0, 5)
    assert (after, wait_s) == (-MILLI, 0.02)
    after, wait_s = take(-MILLI, 0, 50.0, 5)
    assert (after, wait_s) == (-2 * MILLI, 0.04)
    assert wait_for_token_s(500, 1.0) == 0.0


def test_health_reads_waiters_and_how_long_the_bucket_stays_empty() -> None:
    state = bucket_state("api", 2.0, 3, -2500, 250)  # -2500 + 500 after 250 ms
    assert (state.tokens, state.waiting, state.empty_for_s) == (-2.0, 2, 1.5)
    full = bucket_state("api", 2.0, 4, 2 * MILLI, 60_000)
    assert (full.tokens, full.waiting, full.empty_for_s) == (2.0, 0, 0.0)


def test_a_wait_beyond_the_budget_is_one_named_exception() -> None:
    error = too_long_a_wait("api", 12.5)
    assert isinstance(error, jobrun.RetryAfter)
    assert "12.500 s" in error.reason
    assert error.seconds == 12.5


@pytest.mark.parametrize("key", ["api", "it's", 'say "hi"', "x: a token is 1.000 s away"])
def test_a_deferral_for_a_token_names_its_rate_limit(key: str) -> None:
    assert rate_limit_of_deferral(too_long_a_wait(key, 3).reason) == key


@pytest.mark.parametrize(
    "reason", [None, "", "the API said later", "rate limit 'api'", "rate limit api: a token"]
)
def test_another_deferral_names_no_rate_limit(reason: str | None) -> None:
    assert rate_limit_of_deferral(reason) is None


def test_the_pacer_lets_what_is_spent_at_once_go_then_spaces_the_rest() -> None:
    pacer = Pacer(per_second=100, burst=5)
    # A process waking late with six granted tokens: three now, then one per 10 ms.
    delays = [pacer.delay_s(50.0) for _ in range(6)]
    assert delays == pytest.approx([0, 0, 0, 0.01, 0.02, 0.03])
    # In step with the rate, nothing waits; after a lull three go at once again, no more.
    assert pacer.delay_s(50.04) == pytest.approx(0.0)
    assert [pacer.delay_s(60.0) for _ in range(4)] == pytest.approx([0, 0, 0, 0.01])


def test_a_registry_has_one_pacer_per_rate_key() -> None:
    registry = jobrun.JobRegistry()
    registry.rate_limit("api", per_second=5, burst=4)
    api = registry.limits.rates["api"]
    assert registry.limits.pacer(api) is registry.limits.pacer(api)
    assert [registry.limits.pacer(api).delay_s(1.0) for _ in range(3)] == pytest.approx([0, 0, 0.2])


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
