"""Pause and unpause (revision 0009) on the memory store, SQLite and Postgres.

* A run paused while its pass runs stops at the next step boundary: the next step
  body never starts (the bodies' own log says so), nothing is charged, the steps
  that finished are kept and not run again after the unpause, the lease goes back.
* A paused run stays live (a start of its key joins it) and is never claimed: not
  by ``claim``, ``claim_batch`` or ``run_due_jobs``, not after its lease expired,
  and the next-due reads of an idle worker pass over it.
* Unpausing makes it due at once. A paused job holds its runs and the runs started
  meanwhile; a paused limit key defers every step that names it until unpaused.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.predicates import PARKED_AT
from jobrun._core.model.records import ClaimRequest, StepRow
from jobrun._core.port import WRITTEN_PAUSED
from jobrun.testing import FakeClock, drive_until_idle
from tests.support import JOB, MODULE_ID, claim_as, drive, registry_for, row_of, start, start_id

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0)


def _logged_steps(bodies: list[str], names: tuple[str, ...], pause: Any) -> Any:
    """A handler whose steps ``names`` log their bodies into ``bodies``; ``pause(p, name)``
    is awaited inside each body (to pause the run from there)."""

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in names:

            async def body(name: str = name) -> str:
                bodies.append(name)
                await pause(p, name)
                return name.upper()

            await p.step(name, body)
        return jobrun.PassResult(cursor="end", done=True)

    return handler


async def _claim(store: Any, clock: FakeClock, token: str = "T") -> Any:
    now_at = format_instant(clock.now())
    expires = format_instant(clock.now() + timedelta(seconds=60))
    return await store.claim(ClaimRequest(now_at, token, "d", {(MODULE_ID, JOB): expires}))


async def test_a_pause_stops_the_pass_at_its_next_step_and_charges_nothing(
    store: Any, clock: FakeClock
) -> None:
    bodies: list[str] = []

    async def pause_in_two(p: jobrun.JobPass, name: str) -> None:
        if name == "two" and bodies.count("two") == 1:
            await jobrun.pause_job_run(store, p.run.id, reason="maintenance", clock=clock)

    handler = _logged_steps(bodies, ("one", "two", "three", "four"), pause_in_two)
    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock, max_passes=5)
    # The body of "three" never started: the write of "two" told the pass.
    assert bodies == ["one", "two"]
    assert (report.attempted, report.paused, report.failed, report.retrying) == (1, 1, 0, 0)
    row = await row_of(store, run_id)
    assert (row.attempts, row.last_error, row.deferrals, row.cursor) == (0, None, 0, None)
    assert (row.lease_owner, row.next_attempt_at) == (None, PARKED_AT)
    ledger = await store.steps(run_id)
    assert {name: step.result for name, step in ledger.items()} == {"one": '"ONE"', "two": '"TWO"'}
    record = await jobrun.get_job_run(store, run_id)
    assert record is not None
    assert (record.outcome, record.status, record.pause_reason) == (
        "paused",
        "running",
        "maintenance",
    )
    assert record.paused_at is not None
    assert record.next_attempt_at is None  # it waits for its unpause, not for a time
    # Years later, still nothing claims it.
    clock.advance(seconds=3650 * 86400)
    assert (await drive(store, registry, clock)).attempted == 0
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.paused, health.due, health.leased) == (1, 1, 0, 0)
    # Unpaused: due at once, and it goes on from its ledger (one and two not run again).
    unpaused = await jobrun.unpause_job_run(store, run_id, clock=clock)
    assert (unpaused.outcome, unpaused.paused_at, unpaused.next_attempt_at) == (
        "running",
        None,
        None,
    )
    assert (await jobrun.job_run_health(store, clock=clock)).due == 1
    report = await drive(store, registry, clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert bodies == ["one", "two", "three", "four"]


async def test_the_step_write_and_the_commit_tell_the_pause(store: Any, clock: FakeClock) -> None:
    run_id = await start_id(store, clock)
    claimed = await _claim(store, clock)
    assert claimed is not None
    step = StepRow("s", '"v"', 1, None)
    at = format_instant(clock.now())
    assert await store.record_step(run_id, step, at, "T") is True
    await jobrun.pause_job_run(store, run_id, clock=clock)
    # Still held: written, and the answer says the run is paused.
    assert await store.record_step(run_id, step, at, "T") == WRITTEN_PAUSED
    assert await store.record_step(run_id, step, at, "other") is False
    row = await row_of(store, run_id)
    assert row.next_attempt_at == claimed.row.next_attempt_at  # the lease's expiry, kept
    patch = jobrun._core.rules.transitions.unleased(claimed.row)
    assert await store.commit_pass(run_id, patch, "T") == WRITTEN_PAUSED
    # The commit let go of the lease: the paused run waits for its unpause.
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.next_attempt_at) == (None, PARKED_AT)


async def test_a_paused_run_is_never_claimed_not_even_once_its_lease_expired(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    run_id = await start_id(store, clock)
    held = await claim_as(store, clock.now, "DEAD", job=(MODULE_ID, JOB), lease_ms=1000)
    assert held is not None
    await jobrun.pause_job_run(store, run_id, clock=clock)
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.next_attempt_at) == ("DEAD", held.next_attempt_at)
    # Its holder is gone and its lease expired: still nobody's to take.
    clock.advance(seconds=5)
    now_at = format_instant(clock.now())
    expires = {(MODULE_ID, JOB): format_instant(clock.now() + timedelta(seconds=60))}
    for dead in (frozenset(), frozenset({"DEAD"})):
        request = ClaimRequest(now_at, "NEW", "me", expires, dead_owners=dead)
        assert await store.claim(request) is None
        assert await store.claim_batch(request, ["A", "B"]) == []
    assert await store.held_leases(now_at, None) == []
    registry = registry_for(_never_called, IMMEDIATE)
    assert (await drive(store, registry, clock)).attempted == 0
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.due, health.leased, health.paused) == (0, 0, 1)
    # An idle worker's next-due read passes over it (no spinning on a run it cannot take).
    assert await _next_due(store, engine, registry, clock) is None
    # Unpaused: its expired lease is taken over as any other (the holder died mid-pass).
    await jobrun.unpause_job_run(store, run_id, clock=clock)
    claimed = await store.claim(ClaimRequest(now_at, "NEW", "me", expires))
    assert claimed is not None
    assert claimed.taken_over


async def _never_called(p: jobrun.JobPass) -> jobrun.PassResult:
    raise AssertionError("a paused run was driven")


async def _next_due(
    store: Any, engine: AsyncEngine | None, registry: jobrun.JobRegistry, clock: FakeClock
) -> Any:
    """The next due instant an idle worker reads (memory: how far the test kit's idle
    drive would move its clock)."""
    if engine is None:
        report = await drive_until_idle(store, registry, clock=clock)
        return report.advanced_s or None
    from jobrun.sql.next_due import postgres_next_due_at, sqlite_next_due_at

    if engine.dialect.name == "sqlite":
        assert engine.url.database is not None
        from pathlib import Path

        return sqlite_next_due_at(Path(engine.url.database))
    return await postgres_next_due_at(store)


async def test_a_start_joins_a_paused_run_and_a_cancel_ends_it(
    store: Any, clock: FakeClock
) -> None:
    run_id = await start_id(store, clock, payload={"n": 1})
    await jobrun.pause_job_run(store, run_id, reason="hold", clock=clock)
    joined = await start(store, clock, payload={"n": 2})
    assert (joined.id, joined.joined, joined.outcome, joined.payload) == (
        run_id,
        True,
        "paused",
        {"n": 1},
    )
    # Pause is not cancel, but a paused run can be cancelled: then it is no longer paused.
    cancelled = await jobrun.cancel_job_run(store, run_id, "not wanted", clock=clock)
    assert (cancelled.outcome, cancelled.paused_at, cancelled.next_attempt_at) == (
        "cancelled",
        None,
        None,
    )
    assert (await row_of(store, run_id)).paused_at is None


async def test_pausing_twice_changes_nothing_and_an_ended_run_refuses(
    store: Any, clock: FakeClock
) -> None:
    run_id = await start_id(store, clock)
    first = await jobrun.pause_job_run(store, run_id, reason="first", clock=clock)
    clock.advance(seconds=10)
    again = await jobrun.pause_job_run(store, run_id, reason="second", clock=clock)
    assert again == first
    assert (again.pause_reason, again.paused_at) == ("first", first.paused_at)
    # Unpausing what is not paused changes nothing either.
    await jobrun.unpause_job_run(store, run_id, clock=clock)
    row = await row_of(store, run_id)
    assert await jobrun.unpause_job_run(store, run_id, clock=clock) == await jobrun.get_job_run(
        store, run_id
    )
    assert await row_of(store, run_id) == row
    await jobrun.cancel_job_run(store, run_id, "done with it", clock=clock)
    for action in (jobrun.pause_job_run, jobrun.unpause_job_run):
        with pytest.raises(jobrun.JobRunNotLiveError) as refused:
            await action(store, run_id, clock=clock)
        assert (refused.value.code, refused.value.reason) == ("not_live", "job_run_not_running")
        assert "cancelled" in str(refused.value)
    with pytest.raises(jobrun.JobRunNotFoundError):
        await jobrun.pause_job_run(store, "0" * 26, clock=clock)
    with pytest.raises(jobrun.JobValidationError):
        await jobrun.pause_job_run(store, run_id, reason=3, clock=clock)  # type: ignore[arg-type]


async def test_unpause_makes_a_backing_off_run_due_at_once(store: Any, clock: FakeClock) -> None:
    async def failing(p: jobrun.JobPass) -> jobrun.PassResult:
        raise RuntimeError("boom")

    run_id = await start_id(store, clock)
    backing_off = jobrun.RetryPolicy(base_delay_ms=600_000, max_delay_ms=600_000)
    await drive(store, registry_for(failing, backing_off), clock)
    before = await row_of(store, run_id)
    assert before.attempts == 1
    assert before.next_attempt_at is not None
    await jobrun.pause_job_run(store, run_id, clock=clock)
    record = await jobrun.unpause_job_run(store, run_id, clock=clock)
    # Due now (the backoff is forgotten); what the failure charged stays as it was.
    assert (record.next_attempt_at, record.attempts, record.last_error) == (
        None,
        1,
        before.last_error,
    )
    assert (await jobrun.job_run_health(store, clock=clock)).due == 1


async def test_a_pause_after_the_last_step_write_lets_the_pass_commit_and_stops_the_next(
    store: Any, clock: FakeClock
) -> None:
    passes: list[Any] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append(p.cursor)
        await p.step(f"step-{p.cursor}", lambda: 1)
        if p.cursor is None:
            # After the pass's last step write: no write tells it, so it commits as
            # it would; the commit tells it, and its lease goes back (no next pass).
            await jobrun.pause_job_run(store, p.run.id, clock=clock)
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1, done=p.cursor == 3)

    run_id = await start_id(store, clock)
    registry = registry_for(handler, IMMEDIATE)
    report = await drive(store, registry, clock, max_passes=5)
    assert passes == [None]
    assert (report.advanced, report.paused) == (1, 0)
    row = await row_of(store, run_id)
    assert (row.cursor, row.lease_owner, row.next_attempt_at) == ("1", None, PARKED_AT)
    assert await store.steps(run_id) == {}
    await jobrun.unpause_job_run(store, run_id, clock=clock)
    await drive(store, registry, clock, max_passes=5)
    assert passes == [None, 1, 2, 3]
    assert (await row_of(store, run_id)).status == "done"


async def test_a_pass_that_saw_the_pause_commits_nothing_even_if_the_handler_goes_on(
    store: Any, clock: FakeClock
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        async def pausing() -> int:
            await jobrun.pause_job_run(store, p.run.id, clock=clock)
            return 1

        await p.step("pausing", pausing)
        with pytest.raises(jobrun.JobRunPausedError) as stopped:
            await p.step("next", lambda: 2)
        assert stopped.value.code == "paused"
        return jobrun.PassResult(cursor="moved", done=True)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler, IMMEDIATE), clock)
    assert report.paused == 1
    row = await row_of(store, run_id)
    assert (row.status, row.cursor, row.next_attempt_at) == ("running", None, PARKED_AT)
    assert set(await store.steps(run_id)) == {"pausing"}


async def test_a_paused_job_holds_its_runs_and_those_started_meanwhile(
    store: Any, clock: FakeClock
) -> None:
    ran: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(p.run.instance)
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    for instance in ("a", "b"):
        await start_id(store, clock, instance=instance)
    paused = await jobrun.pause_job(
        store, module_id=MODULE_ID, job=JOB, reason="deploy", clock=clock
    )
    assert paused == 2
    # Started while the job is paused: paused from the start, one by one or many at once.
    later = await start(store, clock, instance="c")
    assert (later.outcome, later.pause_reason, later.joined) == ("paused", "deploy", False)
    many = await jobrun.start_job_runs(
        store,
        [jobrun.JobStart(module_id=MODULE_ID, job=JOB, instance=name) for name in ("d", "e")],
        clock=clock,
    )
    assert [record.outcome for record in many] == ["paused", "paused"]
    assert [r.outcome for r in await jobrun.job_runs(store, limit=10)] == ["paused"] * 5
    # Another job is not held.
    other = await start(store, clock, job="other")
    assert other.outcome == "running"
    # Pausing again keeps the record (its reason) and pauses nothing more.
    assert await jobrun.pause_job(store, module_id=MODULE_ID, job=JOB, reason="x") == 0
    health = await jobrun.job_run_health(store, clock=clock)
    assert health.paused == 5
    assert list(health.paused_jobs) == [(MODULE_ID, JOB)]
    assert health.paused_jobs[(MODULE_ID, JOB)].reason == "deploy"
    clock.advance(seconds=86400)
    assert (await drive(store, registry, clock)).attempted == 0
    unpaused = await jobrun.unpause_job(store, module_id=MODULE_ID, job=JOB, clock=clock)
    assert unpaused == 5
    assert (await jobrun.job_run_health(store, clock=clock)).paused_jobs == {}
    await drive(store, registry, clock)
    assert sorted(ran) == ["a", "b", "c", "d", "e"]
    after = await start(store, clock, instance="f")
    assert after.outcome == "running"


async def test_a_failed_run_of_a_paused_job_resumes_paused(store: Any, clock: FakeClock) -> None:
    run_id = await start_id(store, clock)
    await jobrun.cancel_job_run(store, run_id, "oops", clock=clock)
    await jobrun.pause_job(store, module_id=MODULE_ID, job=JOB, reason="deploy", clock=clock)
    resumed = await jobrun.resume_job_run(store, run_id, clock=clock)
    assert (resumed.outcome, resumed.pause_reason, resumed.next_attempt_at) == (
        "paused",
        "deploy",
        None,
    )
    assert (await row_of(store, run_id)).next_attempt_at == PARKED_AT


def _limited(calls: list[str], *, rate: bool) -> jobrun.JobRegistry:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        def call() -> str:
            calls.append(p.run.instance)
            return "ok"

        if rate:
            await p.step("call", call, rate_limit="api")
        else:
            await p.step("call", call, concurrency_limit="tenant-1")
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.rate_limit("api", per_second=50, burst=5)
    registry.concurrency_limit("tenant-", 2)
    return registry


@pytest.mark.parametrize(("key", "rate"), [("api", True), ("tenant-1", False)])
async def test_a_paused_limit_holds_every_step_that_names_it(
    store: Any, clock: FakeClock, key: str, rate: bool
) -> None:
    calls: list[str] = []
    registry = _limited(calls, rate=rate)
    assert await jobrun.pause_limit(store, key, reason="provider outage", clock=clock) is True
    assert await jobrun.pause_limit(store, key, reason="again", clock=clock) is False
    run_id = await start_id(store, clock, instance="a")
    # Whatever the pass budget (none here): the step does not run, the pass is deferred.
    report = await drive(store, registry, clock)
    assert (report.attempted, report.deferred, calls) == (1, 1, [])
    row = await row_of(store, run_id)
    assert (row.attempts, row.deferrals, row.lease_owner) == (0, 0, None)
    assert row.deferred_reason == f"limit {key!r} is paused"
    assert row.next_attempt_at == PARKED_AT
    record = await jobrun.get_job_run(store, run_id)
    assert record is not None
    assert (record.outcome, record.next_attempt_at) == ("running", None)
    health = await jobrun.job_run_health(store, clock=clock)
    assert health.paused_limits[key].reason == "provider outage"
    assert (health.due, health.paused) == (0, 0)
    clock.advance(seconds=86400)
    assert (await drive(store, registry, clock)).attempted == 0
    assert await jobrun.unpause_limit(store, key) == 1
    assert await jobrun.unpause_limit(store, key) == 0
    report = await drive(store, registry, clock)
    assert (report.completed, calls) == (1, ["a"])
    assert (await jobrun.job_run_health(store, clock=clock)).paused_limits == {}


class _UnpausedDuringTheDeferral:
    """A store whose limit is unpaused just before the pass writes its deferral: the
    unpause finds nothing to wake, so the pass must wake itself."""

    def __init__(self, inner: Any, key: str) -> None:
        self.inner = inner
        self.key = key

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def patch(self, run_id: str, patch: Any, token: str) -> bool:
        if patch.deferred_reason == f"limit {self.key!r} is paused":
            assert await jobrun.unpause_limit(self.inner, self.key) == 0
        result: bool = await self.inner.patch(run_id, patch, token)
        return result


async def test_an_unpause_racing_the_deferral_still_wakes_the_run(
    store: Any, clock: FakeClock
) -> None:
    calls: list[str] = []
    registry = _limited(calls, rate=True)
    await jobrun.pause_limit(store, "api", clock=clock)
    run_id = await start_id(store, clock, instance="a")
    report = await drive(_UnpausedDuringTheDeferral(store, "api"), registry, clock)
    assert (report.deferred, calls) == (1, [])
    # The pass looked at the key again after its write: due now, not waiting for ever.
    assert (await row_of(store, run_id)).next_attempt_at is None
    assert (await drive(store, registry, clock)).completed == 1


async def test_a_paused_run_frees_its_lease_and_its_slots(store: Any, clock: FakeClock) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        async def held() -> int:
            usage = await store.limit_usage(format_instant(clock.now()))
            assert dict(usage.slots) == {"tenant-7": 1}
            if p.run.instance == "default":
                await jobrun.pause_job_run(store, p.run.id, clock=clock)
            return 1

        await p.step("held", held, concurrency_limit="tenant-7")
        await p.step("never", lambda: 2)
        return jobrun.PassResult(done=True)

    registry = registry_for(handler, IMMEDIATE)
    registry.concurrency_limit("tenant-", 1)
    run_id = await start_id(store, clock)
    assert (await drive(store, registry, clock)).paused == 1
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.lease_driver) == (None, None)
    usage = await store.limit_usage(format_instant(clock.now()))
    assert dict(usage.slots) == {}
    # The slot is free for another run's step at once.
    other = await start_id(store, clock, instance="other")
    assert (await drive(store, registry, clock)).attempted == 1
    assert (await row_of(store, other)).status == "done"


async def test_a_paused_runs_record_reads_back_as_written(store: Any, clock: FakeClock) -> None:
    run_id = await start_id(store, clock)
    record = await jobrun.pause_job_run(store, run_id, reason="why not", clock=clock)
    listed = await jobrun.job_runs(store, status="running")
    assert [dataclasses.replace(run) for run in listed] == [record]
    assert record.paused_at == clock.now().replace(
        microsecond=clock.now().microsecond // 1000 * 1000
    )
