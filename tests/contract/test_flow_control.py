"""Priorities and per-job concurrency limits in the claim (memory, SQLite, Postgres)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, drive, start

KEY = ("crm", "import")


def _done(p: jobrun.JobPass) -> jobrun.PassResult:
    return jobrun.PassResult(done=True)


async def test_higher_priorities_are_claimed_first_then_due_order(store: Any, clock: FakeClock):
    order: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job(*KEY)
    async def record(p: jobrun.JobPass) -> jobrun.PassResult:
        order.append(p.run.instance)
        return jobrun.PassResult(done=True)

    for instance, priority in [("low", -1), ("plain-1", 0), ("high-1", 5), ("plain-2", 0)]:
        await start(store, clock, instance=instance, priority=priority)
        clock.advance(seconds=1)
    await start(store, clock, instance="high-2", priority=5)
    clock.advance(seconds=1)
    report = await drive(store, registry, clock)
    assert report.completed == 5
    # Priority first (highest first); within one priority, the order runs became due.
    assert order == ["high-1", "high-2", "plain-1", "plain-2", "low"]


async def test_a_run_s_priority_is_kept_and_a_join_keeps_the_live_run_s(
    store: Any, clock: FakeClock
):
    first = await start(store, clock, priority=7)
    joined = await start(store, clock, priority=-3)
    assert (first.priority, joined.id, joined.priority) == (7, first.id, 7)
    assert (await jobrun.get_job_run(store, first.id)).priority == 7  # type: ignore[union-attr]
    assert (await start(store, clock, instance="other")).priority == 0


@pytest.mark.parametrize(
    ("priority", "error"),
    [(True, TypeError), ("1", TypeError), (1.0, TypeError), (2**31, jobrun.JobValidationError)],
)
async def test_a_bad_priority_is_refused_and_nothing_is_written(
    store: Any, clock: FakeClock, priority: Any, error: type[Exception]
):
    with pytest.raises(error, match="priority"):
        await start(store, clock, priority=priority)
    assert await jobrun.job_runs(store) == []


def _request(clock: FakeClock, token: str, limit: int | None, lease_s: float = 60) -> ClaimRequest:
    now = clock()
    expiry = format_instant(now + timedelta(seconds=lease_s))
    return ClaimRequest(
        now_at=format_instant(now),
        token=token,
        driver=f"driver-{token}",
        expires_at={KEY: expiry, ("crm", "other"): expiry},
        max_concurrent={} if limit is None else {KEY: limit},
    )


async def test_a_limited_job_is_passed_over_while_its_limit_is_leased(store: Any, clock: FakeClock):
    for number in range(4):
        await start(store, clock, instance=f"i{number}")
    other = await start(store, clock, job="other")
    clock.advance(seconds=1)
    first = await store.claim(_request(clock, "a", 2))
    second = await store.claim(_request(clock, "b", 2))
    assert {first.row.job, second.row.job} == {"import"}
    # Two runs of the job are leased: the next claim passes over its two due runs
    # and takes the unlimited job's run instead, then finds nothing.
    third = await store.claim(_request(clock, "c", 2))
    assert third.row.id == other.id
    assert await store.claim(_request(clock, "d", 2)) is None
    # Without the limit the same request would lease a third run of the job.
    unlimited = await store.claim(_request(clock, "e", None))
    assert unlimited is not None
    assert unlimited.row.job == "import"


async def test_an_expired_lease_does_not_count_against_the_limit(store: Any, clock: FakeClock):
    for number in range(3):
        await start(store, clock, instance=f"i{number}")
    clock.advance(seconds=1)
    held = [await store.claim(_request(clock, token, 2, lease_s=10)) for token in "ab"]
    assert all(held)
    assert await store.claim(_request(clock, "c", 2)) is None
    # Both holders died: their leases expire, and a claim may lease again (a
    # takeover or the third run) rather than wait forever on dead drivers.
    clock.advance(seconds=11)
    taken = await store.claim(_request(clock, "d", 2))
    assert taken is not None


async def test_a_limited_job_drives_to_the_end_within_its_limit(store: Any, clock: FakeClock):
    registry = jobrun.JobRegistry()
    registry.register(*KEY, _done, max_concurrent=1)
    for number in range(3):
        await start(store, clock, instance=f"i{number}")
    clock.advance(seconds=1)
    # One driver: each pass ends (and its lease goes) before the next claim.
    report = await drive(store, registry, clock)
    assert (report.attempted, report.completed) == (3, 3)


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_concurrent_claimers_never_lease_more_than_the_limit(
    store: Any, engine: AsyncEngine, clock: FakeClock
):
    """Twelve claims at once, each on its own connection, a limit of 2: two win."""
    for round_number in range(5):
        for number in range(8):
            await start(store, clock, instance=f"r{round_number}-{number}")
        clock.advance(seconds=1)
        claims = await asyncio.gather(
            *(store.claim(_request(clock, f"{round_number}-{token}", 2)) for token in range(12))
        )
        won = [claimed.row for claimed in claims if claimed is not None]
        assert len(won) == 2, won
        assert len({row.id for row in won}) == 2
        # Finish the round: nothing stays leased into the next.
        for row in await jobrun.job_runs(store, status="running", limit=500):
            await jobrun.cancel_job_run(store, row.id, "round over", clock=clock)


async def test_a_backing_off_run_does_not_count_against_the_limit(
    store: Any, clock: FakeClock
) -> None:
    first = await jobrun.start_job_run(store, module_id="m", job="j", instance="1", clock=clock)
    registry = jobrun.JobRegistry()
    ran: list[str] = []

    @registry.job("m", "j", max_concurrent=1, retry=jobrun.RetryPolicy(base_delay_ms=60_000))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(p.run.instance)
        if p.run.id == first.id:
            raise RuntimeError("try later")
        return jobrun.PassResult(done=True)

    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).retrying == 1
    await jobrun.start_job_run(store, module_id="m", job="j", instance="2", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.completed, ran) == (1, ["1", "2"])
