"""Contract tests for rate and concurrency limits, on the memory store, SQLite and Postgres.

* Tokens: however many takers on however many store objects (connections) of one
  database, the tokens due within a window never exceed ``burst + rate * window``.
* A step the ledger answers takes no token; an undeclared name fails the run.
* Slots: concurrent bodies under one key stay within the limit across drivers
  on two stores of one database; a slot whose lease expired or was taken over
  no longer counts; a cancelled pass lets go of its slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun._core.operator.waiting import waiting_of
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import JOB, drive, registry_for, row_of, start_id
from tests.support import MODULE_ID as MODULE

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0)


@asynccontextmanager
async def stores_of(store: Any, engine: AsyncEngine | None, count: int) -> AsyncIterator[list[Any]]:
    """``count`` stores on the one database of ``store``, each on an engine of its own
    (its own connections); the memory store is its own database."""
    if engine is None:
        yield [store] * count
        return
    engines = [create_async_engine(engine.url) for _ in range(count)]
    try:
        yield [jobrun.SqlJobRunStore(each) for each in engines]
    finally:
        for each in engines:
            await each.dispose()


# --- tokens ------------------------------------------------------------------------------


async def test_concurrent_takers_are_never_issued_more_than_the_bucket_allows(
    store: Any, engine: AsyncEngine | None
) -> None:
    rate, burst, takers, takes = 20.0, 3, 4, 15
    async with stores_of(store, engine, takers) as stores:
        await stores[0].take_token("warm-up", 1.0, 1)  # the schema check, once per store

        async def taker(one: Any) -> list[float]:
            return [await one.take_token("api", rate, burst) for _ in range(takes)]

        began = time.monotonic()
        waits = sorted(
            wait for got in await asyncio.gather(*(taker(one) for one in stores)) for wait in got
        )
        window_s = time.monotonic() - began
    assert len(waits) == takers * takes
    # Every take with a wait of at most x is due by the window's end plus x: the
    # bucket can have refilled no more than burst + rate * (window + x) tokens by then.
    for count, wait in enumerate(waits, start=1):
        assert count <= burst + rate * (window_s + wait) + 1, (count, wait, window_s)
    # And the queue is real: the last reservation is (about) as far out as the rate says.
    assert waits[-1] >= (len(waits) - burst) / rate - window_s - 0.01


async def test_a_bucket_refills_at_its_rate_and_health_reads_it(store: Any) -> None:
    # Declared burst 4: 2 at once (the other 2 kept back for the jitter at the API).
    assert await store.take_token("slow", 0.5, 4) == 0.0
    assert await store.take_token("slow", 0.5, 4) == 0.0
    wait = await store.take_token("slow", 0.5, 4)
    assert 1.5 < wait <= 2.0  # the next token is 2 s after the burst at 0.5/s
    usage = await store.limit_usage(format_instant(FakeClock().now()))
    [bucket] = usage.buckets
    assert (bucket.key, bucket.per_second, bucket.burst, bucket.waiting) == ("slow", 0.5, 4, 1)
    assert -1.0 <= bucket.tokens < -0.5
    assert 3.5 < bucket.empty_for_s <= 4.0
    # jobrun health (and the console) show the same.
    health = await jobrun.job_run_health(store)
    assert [(shown.key, shown.waiting) for shown in health.rate_limits] == [("slow", 1)]
    assert health.concurrency_slots == {}
    # A token given back (the pass would not wait that long) is one waiter fewer.
    await store.give_back_token("slow", 4)
    [bucket] = (await store.limit_usage(format_instant(FakeClock().now()))).buckets
    assert bucket.waiting == 0


async def test_a_replayed_step_takes_no_token_and_a_fresh_one_does(
    store: Any, clock: FakeClock
) -> None:
    calls: list[str] = []
    passes: list[int] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append(1)
        await p.step("call", lambda: calls.append("call"), rate_limit="api")
        if len(passes) == 1:
            raise RuntimeError("after the step")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.rate_limit("api", per_second=0.001, burst=5)
    run_id = await start_id(store, clock)
    assert (await drive(store, registry, clock)).retrying == 1
    assert (await drive(store, registry, clock)).completed == 1
    assert calls == ["call"]
    assert (await row_of(store, run_id)).status == "done"
    [bucket] = (await store.limit_usage(format_instant(clock.now()))).buckets
    # One token of the three spent at once taken (0.001/s refills nothing worth a
    # token meanwhile).
    assert 2.0 <= bucket.tokens < 2.1


@pytest.mark.parametrize("declared", ["rate", "concurrency"])
async def test_an_undeclared_limit_fails_the_run_at_once(
    store: Any, clock: FakeClock, declared: str
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if declared == "rate":
            await p.step("call", lambda: 1, rate_limit="nobody-declared-me")
        else:
            await p.step("call", lambda: 1, concurrency_limit="tenant-7")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.concurrency_limit("other-", 2)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock)
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.last_error is not None
    assert ("is not declared" if declared == "rate" else "matches no declared prefix") in (
        row.last_error
    )
    assert await store.steps(run_id) == {}


# --- slots -------------------------------------------------------------------------------


async def test_slots_bound_concurrent_bodies_across_drivers_on_two_stores(
    store: Any, engine: AsyncEngine | None
) -> None:
    in_flight, most_seen = 0, 0

    async def body() -> None:
        nonlocal in_flight, most_seen
        in_flight += 1
        most_seen = max(most_seen, in_flight)
        await asyncio.sleep(0.03)  # sleep: real overlap between the drivers' bodies
        in_flight -= 1

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("call", body, concurrency_limit="tenant-1")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.concurrency_limit("tenant-", 2)
    for number in range(8):
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance=f"r{number}")
    async with stores_of(store, engine, 2) as stores:
        reports = await asyncio.gather(
            *(jobrun.run_due_jobs(stores[index % 2], registry, limit=8) for index in range(5))
        )
    assert sum(report.completed for report in reports) == 8
    assert most_seen == 2
    assert (await store.limit_usage(format_instant(FakeClock().now()))).slots == {}


async def _leased_run(store: Any, clock: FakeClock, instance: str, token: str) -> str:
    run = await jobrun.start_job_run(
        store, module_id=MODULE, job=JOB, instance=instance, clock=clock
    )
    expires_at = format_instant(clock.now().replace(year=2026, month=1, day=2))
    request = ClaimRequest(
        format_instant(clock.now()), token, "test:0", {(MODULE, JOB): expires_at}
    )
    claimed = await store.claim(request)
    assert claimed is not None
    assert claimed.row.id == run.id
    return run.id


async def test_a_slot_counts_only_while_its_lease_holds(store: Any, clock: FakeClock) -> None:
    now_at = format_instant(clock.now())
    first = await _leased_run(store, clock, "a", "TOKEN-A")
    second = await _leased_run(store, clock, "b", "TOKEN-B")
    assert await store.acquire_slot("tenant-1", 1, first, "s", "TOKEN-A", now_at)
    assert not await store.acquire_slot("tenant-1", 1, second, "s", "TOKEN-B", now_at)
    assert (await store.limit_usage(now_at)).slots == {"tenant-1": 1}
    # Once the first run's lease has expired its slot is free, with no write.
    later_at = "2026-01-02T00:00:00.001Z"
    assert (await store.limit_usage(later_at)).slots == {}
    # A slot taken under a token that is not the run's lease never counts.
    assert await store.acquire_slot("tenant-2", 1, first, "s", "STALE", now_at)
    assert await store.acquire_slot("tenant-2", 1, first, "t", "TOKEN-A", now_at)
    # Letting go frees the slot at once, and cleans the stale row on the way.
    await store.release_slot("tenant-1", first, "s", "TOKEN-A", now_at)
    assert await store.acquire_slot("tenant-1", 1, second, "s", "TOKEN-B", now_at)
    assert (await store.limit_usage(now_at)).slots == {"tenant-1": 1, "tenant-2": 1}


async def test_a_taken_over_run_frees_its_holders_slot(store: Any, clock: FakeClock) -> None:
    now_at = format_instant(clock.now())
    run_id = await _leased_run(store, clock, "a", "OLD")
    assert await store.acquire_slot("tenant-1", 1, run_id, "s", "OLD", now_at)
    # Another driver takes the run over (its lease expired): the old slot is gone.
    clock.advance(seconds=2 * 86400)
    later_at = format_instant(clock.now())
    request = ClaimRequest(later_at, "NEW", "test:1", {(MODULE, JOB): "2026-02-01T00:00:00.000Z"})
    assert (await store.claim(request)) is not None
    assert await store.acquire_slot("tenant-1", 1, run_id, "s", "NEW", later_at)


async def test_a_cancelled_pass_lets_go_of_its_slot(store: Any) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        entered.set()
        await asyncio.Event().wait()  # until cancelled

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("call", body, concurrency_limit="tenant-1")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.concurrency_limit("tenant-", 1)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance="x")
    driving = asyncio.ensure_future(jobrun.run_due_jobs(store, registry, limit=1))
    await entered.wait()
    now_at = format_instant(jobrun.testing.FakeClock().now())
    assert (await store.limit_usage(now_at)).slots == {"tenant-1": 1}
    driving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await driving
    assert (await store.limit_usage(now_at)).slots == {}


# --- the pass budget -------------------------------------------------------------------


async def test_a_wait_for_a_token_does_not_eat_the_pass_budget() -> None:
    clock = FakeClock(autojump=True)
    store = MemoryJobRunStore(clock=clock)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for number in range(4):
            await p.step(f"call-{number}", lambda: 1, rate_limit="api")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.rate_limit("api", per_second=1, burst=1)
    run_id = await start_id(store, clock)
    # Three waits of a second each, under a budget of 1.5 s: none is the handler's time.
    report = await drive(store, registry, clock, pass_timeout_s=1.5)
    assert report.completed == 1, report.errors
    assert (await row_of(store, run_id)).status == "done"
    assert clock.monotonic() >= 3.0


async def test_a_wait_beyond_the_pass_budget_ends_the_pass_and_gives_the_token_back() -> None:
    clock = FakeClock(autojump=True)
    store = MemoryJobRunStore(clock=clock)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", lambda: 1, rate_limit="api")
        await p.step("second", lambda: 2, rate_limit="api")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.rate_limit("api", per_second=0.1, burst=1)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock, pass_timeout_s=5)
    # Deferred, not failed: nothing charged, due again when the token would be there.
    assert (report.deferred, report.retrying) == (1, 0)
    row = await row_of(store, run_id)
    assert (row.attempts, row.last_error, row.deferrals) == (0, None, 1)
    assert row.deferred_reason is not None
    assert "'api'" in row.deferred_reason
    assert "beyond the pass budget" in row.deferred_reason
    # What the run page says it waits for: the limit, by name, until its token.
    run = await jobrun.get_job_run(store, run_id)
    assert run is not None
    waiting = waiting_of(run, clock.now())
    assert waiting is not None
    assert (waiting.kind, waiting.at) == ("limit", run.next_attempt_at)
    assert waiting.reason == "rate limit 'api': no token within the pass budget"
    assert (await store.steps(run_id))["first"].result == "1"
    [bucket] = (await store.limit_usage(format_instant(clock.now()))).buckets
    assert bucket.waiting == 0


# --- a 429 for everyone: RetryAfter(rate_limit=key) -----------------------------------------


async def test_a_cooled_limit_holds_its_bucket_for_every_taker(store: Any) -> None:
    assert await store.take_token("api", 10.0, 4) == 0.0
    cooled_s = time.monotonic()
    await store.cool_limit("api", 10.0, 4, 30.0, "429 from api")
    # No token before the cooling down ends; the first after it at its end, the
    # next one a token's interval later. Each wait is counted from the database's
    # now at that take, so the time between the calls (long on a loaded machine)
    # comes off it: bounded by what this process measured around them.
    first_asked_s = time.monotonic()
    first = await store.take_token("api", 10.0, 4)
    second = await store.take_token("api", 10.0, 4)
    between_s = time.monotonic() - first_asked_s
    assert 30.0 - (time.monotonic() - cooled_s) - 0.002 <= first <= 30.0
    assert 0.1 - between_s - 0.002 <= second - first <= 0.1 + 0.002
    # A shorter cooling down does not cut a longer one short.
    await store.cool_limit("api", 10.0, 4, 1.0, "a shorter one")
    third = await store.take_token("api", 10.0, 4)
    assert 30.2 - (time.monotonic() - cooled_s) - 0.002 <= third <= 30.2 + 0.002
    [bucket] = (await store.limit_usage(format_instant(FakeClock().now()))).buckets
    assert bucket.cooling_reason == "429 from api"
    assert bucket.cooling_until is not None
    assert bucket.empty_for_s > 29.0
    health = await jobrun.job_run_health(store)
    assert [(shown.key, shown.cooling_reason) for shown in health.rate_limits] == [
        ("api", "429 from api")
    ]
    # A limit cooled before anyone took a token is held all the same.
    await store.cool_limit("other", 5.0, 1, 20.0, "maintenance")
    assert 19.0 < await store.take_token("other", 5.0, 1) <= 20.0


async def test_a_429_in_one_run_makes_another_run_wait_instead_of_calling(
    store: Any, clock: FakeClock
) -> None:
    calls: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        def call() -> str:
            calls.append(p.run.id)
            if p.payload["refused"]:
                raise jobrun.RetryAfter(600, reason="429 from api", rate_limit="api")
            return "ok"

        await p.step("call", call, rate_limit="api")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.rate_limit("api", per_second=50, burst=5)
    refused = await start_id(store, clock, instance="a", payload={"refused": True})
    report = await drive(store, registry, clock, pass_timeout_s=5)
    assert report.deferred == 1
    other = await start_id(store, clock, instance="b", payload={"refused": False})
    report = await drive(store, registry, clock, pass_timeout_s=5)
    # The other run's step did not call the API: its token is 600 s away, beyond
    # its pass budget, so its pass was deferred, nothing charged.
    assert calls == [refused]
    assert report.deferred == 1
    row = await row_of(store, other)
    assert (row.attempts, row.deferrals) == (0, 1)
    assert row.deferred_reason is not None
    assert "rate limit 'api'" in row.deferred_reason
    [bucket] = (await store.limit_usage(format_instant(clock.now()))).buckets
    assert bucket.cooling_reason == "429 from api"


async def test_a_429_naming_an_undeclared_limit_is_a_mistake(store: Any, clock: FakeClock) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        def call() -> None:
            raise jobrun.RetryAfter(5, rate_limit="not-declared")

        await p.step("call", call)
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler, IMMEDIATE), clock)
    assert report.deferred == 0
    row = await row_of(store, run_id)
    assert row.last_error is not None
    assert "'not-declared' is not declared" in row.last_error
