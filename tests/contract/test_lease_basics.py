"""Lease basics on every backend: claim, fence, takeover, hand-back."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.leases.claims import PreviousHolder
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import ClaimRequest, StepRow
from jobrun.testing import FakeClock
from tests.support import claim_as


def _claim_request(clock, token: str, lease_ms: int = 1000) -> ClaimRequest:
    from jobrun._core.model.formats import add_milliseconds

    now_at = format_instant(clock())
    return ClaimRequest(now_at, token, "zombie:1", {("m", "j"): add_milliseconds(now_at, lease_ms)})


async def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_out(store, clock):
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    claimed = await store.claim(_claim_request(clock, "OLD-TOKEN"))
    assert claimed is not None
    assert claimed.row.id == run.id
    assert claimed.row.lease_owner == "OLD-TOKEN"
    assert not claimed.taken_over
    # While the lease holds, nobody else can claim the run.
    assert await store.claim(_claim_request(clock, "OTHER")) is None
    assert await store.record_step(run.id, StepRow("a", "1", 1, None), "t", "OLD-TOKEN")

    ran: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", lease_ms=1000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(await p.step("a", lambda: 99))
        return jobrun.PassResult(cursor="next")

    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.attempted == 0, "a held lease is not due"

    clock.advance(seconds=2)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.advanced) == (1, 1)
    assert ran == [1], "the step the zombie committed is a memo hit for the new holder"
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.lease_takeovers == 0, "a commit resets the takeover count"
    assert record.cursor == "next"
    assert record.lease_driver is None

    # The zombie wakes up: every write it tries is refused.
    assert not await store.record_step(run.id, StepRow("b", "2", 1, None), "t", "OLD-TOKEN")
    assert not await store.extend_lease(
        run.id, "OLD-TOKEN", "2999-01-01T00:00:00.000Z", "2000-01-01T00:00:00.000Z"
    )
    assert await store.steps(run.id) == {}


async def test_cancel_during_a_pass_supersedes_it(store, clock):
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    bodies: list[str] = []

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", lambda: bodies.append("first"))
        await jobrun.cancel_job_run(store, p.run.id, "operator said so", clock=clock)
        await p.step("second", lambda: bodies.append("second"))
        await p.step("third", lambda: bodies.append("third"))
        return jobrun.PassResult(cursor="never")

    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.superseded == 1
    assert (report.advanced, report.failed, report.retrying) == (0, 0, 0)
    assert bodies == ["first", "second"], "the pass stops at the first refused write"
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "failed"
    assert record.last_error == "cancelled: operator said so"
    assert record.cursor is None

    resumed = await jobrun.resume_job_run(store, run.id, clock=clock)
    assert resumed.status == "running"
    bodies.clear()

    @registry.job("m", "j2")
    async def unused(p: jobrun.JobPass) -> None:
        return None

    registry2 = jobrun.JobRegistry()

    @registry2.job("m", "j")
    async def finish(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", lambda: bodies.append("first"))
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(store, registry2, clock=clock)
    assert report.completed == 1
    assert bodies == [], "the step committed before the cancel is not repeated"


async def test_prune_and_release(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    done = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    live = await jobrun.start_job_run(store, module_id="m", job="j", instance="x", clock=clock)
    claimed = await store.claim(_claim_request(clock, "T"))
    assert claimed is not None
    assert claimed.row.id == live.id
    assert await jobrun.release_job_lease(store, live.id)
    assert not await jobrun.release_job_lease(store, live.id)
    clock.advance(seconds=10)

    assert await jobrun.prune_job_runs(store, older_than=timedelta(seconds=5), clock=clock) == 1
    assert await jobrun.get_job_run(store, done.id) is None
    assert await jobrun.get_job_run(store, live.id) is not None


async def test_health_counts(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(max_attempts=1))
    async def handler(p: jobrun.JobPass) -> None:
        raise RuntimeError("boom")

    await jobrun.start_job_run(store, module_id="m", job="j", instance="fails", clock=clock)
    clock.advance(seconds=1)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    await jobrun.start_job_run(store, module_id="m", job="j", instance="a", clock=clock)
    clock.advance(seconds=3)
    await jobrun.start_job_run(store, module_id="m", job="j", instance="b", clock=clock)
    claimed = await store.claim(_claim_request(clock, "T"))
    assert claimed is not None
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased, health.failed) == (2, 1, 1, 1)
    assert health.oldest_due_age_s == 0.0, "the older live run is the leased one"
    clock.advance(seconds=2)
    health = await jobrun.job_run_health(store, clock=clock)
    assert health.oldest_due_age_s == 2.0


@pytest.mark.parametrize("died", [False, True], ids=["expired", "died"])
async def test_a_claim_says_whose_lease_it_took_over(store, clock, died):
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    began_at = format_instant(clock())
    first = await store.claim(_claim_request(clock, "OLD-TOKEN", lease_ms=60_000))
    assert first is not None
    assert first.previous is None, "a fresh claim took nothing over"
    # Expired by the clock, or its holder proven dead while its lease still runs.
    clock.advance(seconds=1 if died else 61)
    request = replace(
        _claim_request(clock, "NEW"), dead_owners=frozenset({"OLD-TOKEN"} if died else ())
    )
    claimed = await store.claim(request)
    assert claimed is not None
    assert claimed.taken_over
    assert claimed.previous == PreviousHolder("OLD-TOKEN", "zombie:1", began_at, died=died)
    assert claimed.row == await store.get(run.id), "the row as written"
    assert (claimed.row.lease_owner, claimed.row.lease_takeovers) == ("NEW", 1)
    assert claimed.row.attempts == 1, "the pass had begun: an attempt is charged"
    cause = "died during a pass" if died else "expired during a pass"
    assert claimed.row.last_error is not None
    assert cause in claimed.row.last_error


async def test_health_counts_each_kind_of_run_apart(store: Any, clock: FakeClock) -> None:
    for instance in ("a", "b", "c"):
        await jobrun.start_job_run(store, module_id="m", job="j", instance=instance, clock=clock)
    assert await claim_as(store, clock, "LIVE-HOLDER", driver="alive", lease_ms=60_000)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased, health.failed) == (3, 2, 1, 0)
