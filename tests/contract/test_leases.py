"""The lease, rule by rule, in one process on every backend (memory, SQLite, Postgres).

Each test drives the public API (or the store port where a dead driver has to be
simulated: a claim that is never followed by a pass is exactly what a driver that
died right after claiming leaves behind) and asserts the rule it names, so that a
broken rule fails here. Races with operators are made deterministic with
``asyncio.Event`` handshakes: the pass waits inside a step body while the test
acts, then carries on.

Every test uses a ``FakeClock``. The background renewal waits on the drive's
clock too, so the renewal tests move the clock by hand and wait for each renewal
to land (an event, never a sleep).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.leases.claims import Claimed
from jobrun._core.model.formats import add_milliseconds, format_instant, parse_instant
from jobrun._core.model.records import ClaimRequest, RunRow, StepRow
from jobrun.testing import FakeClock
from tests.support import claim_as, dead_driver, fixed_random, row_of, set_columns, snapshot

M, J = "m", "j"


def assert_unleased(row: RunRow) -> None:
    assert (row.lease_owner, row.lease_driver, row.lease_began_at) == (None, None, None)


# --- registration ----------------------------------------------------------------------------


def _noop(p: jobrun.JobPass) -> None:
    return None


@pytest.mark.parametrize("lease_ms", [99, 0, -1, -1000])
def test_a_lease_below_100_ms_is_refused(lease_ms):
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError, match="at least 100") as refused:
        registry.register(M, J, _noop, lease_ms=lease_ms)
    assert refused.value.errors == [{"path": "lease_ms", "message": "below 100"}]
    with pytest.raises(jobrun.JobValidationError):
        registry.job(M, J, lease_ms=lease_ms)(_noop)
    assert (M, J) not in registry


@pytest.mark.parametrize("lease_ms", [100.0, 1.5, "1000", None, True, False])
def test_a_lease_that_is_not_an_int_is_refused(lease_ms):
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match="lease_ms") as refused:
        registry.register(M, J, _noop, lease_ms=lease_ms)
    assert isinstance(refused.value, jobrun.JobValidationError)
    assert [entry["path"] for entry in refused.value.errors] == ["lease_ms"]
    assert (M, J) not in registry


@pytest.mark.parametrize("max_takeovers", [1.0, "3", None, True])
def test_max_takeovers_must_be_an_int(max_takeovers):
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match="max_takeovers"):
        registry.register(M, J, _noop, max_takeovers=max_takeovers)
    assert (M, J) not in registry


def test_max_takeovers_must_not_be_negative():
    registry = jobrun.JobRegistry()
    with pytest.raises(ValueError, match="max_takeovers"):
        registry.register(M, J, _noop, max_takeovers=-1)
    assert (M, J) not in registry


def test_the_smallest_lease_and_no_takeovers_are_accepted():
    registry = jobrun.JobRegistry()
    registry.register(M, J, _noop, lease_ms=100, max_takeovers=0)
    registered = registry.get(M, J)
    assert registered is not None
    assert (registered.lease_ms, registered.max_takeovers) == (100, 0)
    default = jobrun.JobRegistry()
    default.register(M, J, _noop)
    registered = default.get(M, J)
    assert registered is not None
    assert (registered.lease_ms, registered.max_takeovers) == (60 * 1000, 5)


# --- the claim writes the lease, every outcome clears it ----------------------------------


OUTCOMES = ["advanced", "completed", "retrying", "failed"]


@pytest.mark.parametrize("outcome", OUTCOMES)
async def test_a_claim_writes_the_lease_and_the_outcome_clears_it(store, clock, outcome):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    claimed_at = clock()
    seen: dict[str, Any] = {}
    registry = jobrun.JobRegistry()
    retry = jobrun.RetryPolicy(
        max_attempts=1 if outcome == "failed" else 3, base_delay_ms=1000, max_delay_ms=1000
    )

    @registry.job(M, J, lease_ms=5000, retry=retry)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen["row"] = await row_of(store, p.run.id)
        seen["record"] = await jobrun.get_job_run(store, p.run.id)
        clock.advance(seconds=1)
        if outcome in ("retrying", "failed"):
            raise RuntimeError("boom")
        return jobrun.PassResult(cursor="c", done=outcome == "completed")

    report = await jobrun.run_due_jobs(
        store, registry, clock=clock, driver_name="host-a:42", random=fixed_random
    )
    assert getattr(report, outcome) == 1
    assert report.superseded == 0

    # While the pass ran, the row carried the lease and the expiry sat in next_attempt_at.
    leased: RunRow = seen["row"]
    expiry = add_milliseconds(format_instant(claimed_at), 5000)
    assert leased.lease_owner, "a fencing token"
    assert "host-a" not in leased.lease_owner, "the token is not the driver's name"
    # The name for operators, then this process's identity (see jobrun._core.leases.holders).
    assert leased.lease_driver is not None
    assert leased.lease_driver.startswith("host-a:42 [jobrun host=")
    assert leased.lease_began_at == format_instant(claimed_at)
    assert leased.next_attempt_at == expiry
    assert leased.lease_takeovers == 0
    record: jobrun.JobRun = seen["record"]
    assert record.lease_driver == leased.lease_driver
    assert record.lease_expires_at == parse_instant(expiry)
    assert record.lease_takeovers == 0

    after = await row_of(store, run.id)
    assert_unleased(after)
    assert after.lease_takeovers == 0
    finished_at = claimed_at + timedelta(seconds=1)
    if outcome == "retrying":
        # The real backoff (1 s after the failure), never the lease expiry.
        assert after.next_attempt_at == format_instant(finished_at + timedelta(seconds=1))
    else:
        assert after.next_attempt_at is None
    final = await jobrun.get_job_run(store, run.id)
    assert final is not None
    assert (final.lease_driver, final.lease_expires_at) == (None, None)


async def test_every_claim_mints_a_fresh_token_and_a_kept_lease_moves_on(store, clock):
    await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    seen: list[RunRow] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=2000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(await row_of(store, p.run.id))
        clock.advance(seconds=1)
        return jobrun.PassResult(cursor=len(seen))

    await jobrun.run_due_jobs(store, registry, clock=clock, max_passes=2)
    await jobrun.run_due_jobs(store, registry, clock=clock, max_passes=1)
    first, second, third = seen
    # Between passes of one call the lease is handed on, under a fresh token (so that a
    # write fenced on the old token can never land over the commit), the same driver,
    # a new start and a new expiry.
    assert second.lease_owner is not None
    assert second.lease_owner != first.lease_owner
    assert second.lease_driver == first.lease_driver
    assert first.lease_began_at is not None
    assert second.lease_began_at is not None
    assert second.lease_began_at == add_milliseconds(first.lease_began_at, 1000)
    assert second.next_attempt_at == add_milliseconds(second.lease_began_at, 2000)
    # A new call claims again, with a new token.
    assert third.lease_owner not in (None, first.lease_owner, second.lease_owner)


# --- a held lease, expiry and takeover ---------------------------------------------------------


async def test_a_run_leased_by_another_token_is_not_claimed_before_expiry(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    held = await claim_as(store, clock, "HOLDER", lease_ms=1000)
    assert held is not None
    assert held.id == run.id
    assert await claim_as(store, clock, "OTHER") is None
    ran: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=1000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(p.run.id)
        return jobrun.PassResult()

    clock.advance(milliseconds=999)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, ran) == (0, [])
    assert (await row_of(store, run.id)).lease_owner == "HOLDER"
    clock.advance(milliseconds=1)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.advanced, ran) == (1, 1, [run.id])


async def test_a_takeover_counts_and_charges_an_attempt_with_the_reason(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    assert await claim_as(store, clock, "DEAD", driver="dead-host:7") is not None
    seen: list[tuple[RunRow, jobrun.JobRun | None]] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=1000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append((await row_of(store, p.run.id), await jobrun.get_job_run(store, p.run.id)))
        return jobrun.PassResult(cursor="after")

    clock.advance(seconds=1)
    report = await jobrun.run_due_jobs(store, registry, clock=clock, driver_name="b:1")
    assert (report.attempted, report.advanced, report.superseded) == (1, 1, 0)
    [(row, record)] = seen
    assert row.lease_owner not in (None, "DEAD")
    assert row.lease_driver is not None
    assert row.lease_driver.startswith("b:1 [jobrun ")
    assert row.lease_takeovers == 1
    assert row.attempts == 1
    assert row.last_error == (
        "the lease of driver dead-host:7 expired during a pass; the run was taken over"
    )
    assert record is not None
    assert record.lease_takeovers == 1
    after = await row_of(store, run.id)
    assert (after.lease_takeovers, after.attempts, after.last_error) == (0, 0, None)
    assert_unleased(after)


async def test_a_takeover_of_a_lease_whose_pass_never_began_charges_nothing(store, engine, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    assert await claim_as(store, clock, "NEVER-BEGAN") is not None
    await set_columns(
        store, engine, run.id, lease_began_at=None, attempts=2, last_error="an earlier failure"
    )
    seen: list[RunRow] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=1000)
    async def handler(p: jobrun.JobPass) -> None:
        seen.append(await row_of(store, p.run.id))

    clock.advance(seconds=1)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    [row] = seen
    assert row.lease_takeovers == 1
    assert (row.attempts, row.last_error) == (2, "an earlier failure")


async def test_takeovers_are_consecutive_a_failure_keeps_the_count_a_commit_resets_it(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    seen: list[int] = []
    fail = [True]
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=1000, max_takeovers=2, retry=jobrun.RetryPolicy(base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append((await row_of(store, p.run.id)).lease_takeovers)
        if fail[0]:
            raise RuntimeError("flaky")
        return jobrun.PassResult()

    assert await claim_as(store, clock, "DEAD-0") is not None
    clock.advance(seconds=1)
    taken = await claim_as(store, clock, "DEAD-1")
    assert taken is not None
    assert taken.lease_takeovers == 1
    clock.advance(seconds=1)
    # The second takeover is within the limit of 2: the pass runs, and fails.
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.retrying, seen) == (1, [2])
    assert (await row_of(store, run.id)).lease_takeovers == 2, "a failure is not a commit"
    fail[0] = False
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.advanced, seen) == (1, [2, 2])
    assert (await row_of(store, run.id)).lease_takeovers == 0, "a commit resets the count"
    # The count starts again from zero.
    assert await claim_as(store, clock, "DEAD-2") is not None
    clock.advance(seconds=1)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.advanced, seen) == (1, [2, 2, 1])


@pytest.mark.parametrize("limit", [0, 2])
async def test_a_run_taken_over_more_than_max_takeovers_times_is_failed(store, clock, limit):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    ran: list[int] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=1000, max_takeovers=limit)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(1)
        return jobrun.PassResult(cursor="ok")

    assert await claim_as(store, clock, "DEAD-0", driver="dead:0") is not None
    for number in range(1, limit + 1):
        clock.advance(seconds=1)
        row = await claim_as(store, clock, f"DEAD-{number}", driver=f"dead:{number}")
        assert row is not None
        assert (row.lease_takeovers, row.attempts) == (number, number)
    clock.advance(seconds=1)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert ran == [], "no pass is given to a run over the limit"
    assert (report.attempted, report.failed, report.superseded) == (1, 1, 0)
    [error] = report.errors
    assert error.run_id == run.id
    assert f"taken over {limit + 1} times in a row" in error.error
    assert f"the limit is {limit}" in error.error
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "failed"
    assert record.last_error == error.error
    assert record.ended_at == clock()
    assert record.next_attempt_at is None
    assert (record.lease_driver, record.lease_expires_at) == (None, None)
    assert record.lease_takeovers == limit + 1, "the operator sees how often it was taken over"
    assert record.attempts == limit + 1
    assert_unleased(await row_of(store, run.id))

    # Resuming it starts the count again: the next pass runs and commits.
    resumed = await jobrun.resume_job_run(store, run.id, clock=clock)
    assert (resumed.status, resumed.attempts, resumed.lease_takeovers) == ("running", 0, 0)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.advanced, ran) == (1, [1])


# --- renewal, on the fake clock ------------------------------------------------------------


class _Renewals:
    """A store that reports each background renewal (and whether it held) once it landed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.landed: asyncio.Queue[bool] = asyncio.Queue()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def extend_lease(self, run_id: str, token: str, expires_at: str, now_at: str) -> bool:
        held = await self.inner.extend_lease(run_id, token, expires_at, now_at)
        self.landed.put_nowait(held)
        return held


async def test_background_renewal_keeps_a_long_step_leased(store, clock):
    """A step three times as long as the lease: renewed every quarter lease, never taken.

    The renewal waits on the drive's clock, so the test moves the clock a quarter
    lease at a time and waits for each renewal to land: no real time passes."""
    lease_ms = 300
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    inside = asyncio.Event()
    renewals = _Renewals(store)
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=lease_ms)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        async def long() -> str:
            inside.set()
            await clock.sleep((3 * lease_ms + 1) / 1000)
            return "slow"

        await p.step("long", long)
        # Done, so that after this commit nothing is left for the rival either.
        return jobrun.PassResult(cursor="after", done=True)

    stolen: list[str] = []
    rival = jobrun.JobRegistry()

    @rival.job(M, J, lease_ms=lease_ms)
    async def rival_handler(p: jobrun.JobPass) -> None:
        stolen.append(p.run.id)

    holder = asyncio.create_task(
        jobrun.run_due_jobs(renewals, registry, driver_name="holder", clock=clock)
    )
    await asyncio.wait_for(inside.wait(), 10)
    assert clock.sleepers == 2, "the step and the lease keeper wait on the clock"
    expiries: list[str] = []
    for _ in range(12):
        clock.advance(milliseconds=lease_ms / 4)
        assert await asyncio.wait_for(renewals.landed.get(), 10), "a renewal was refused"
        rival_report = await jobrun.run_due_jobs(store, rival, driver_name="rival", clock=clock)
        assert rival_report.attempted == 0
        row = await row_of(store, run.id)
        assert row.next_attempt_at == add_milliseconds(format_instant(clock()), lease_ms)
        expiries.append(row.next_attempt_at)
    clock.advance(milliseconds=1)
    report = await asyncio.wait_for(holder, 10)

    assert (report.completed, report.superseded) == (1, 0)
    assert stolen == []
    assert len(set(expiries)) == 12, "each renewal moves the expiry a quarter lease on"
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.cursor, record.lease_driver) == ("after", None)


@pytest.mark.parametrize("handler_swallows", [False, True])
async def test_a_pass_whose_renewal_finds_the_lease_gone_stops_before_the_next_step(
    store, clock, handler_swallows
):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    renewals = _Renewals(store)
    after_first = asyncio.Event()
    go_on = asyncio.Event()
    bodies: list[str] = []
    caught: list[BaseException] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=200)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: bodies.append("a"))
        after_first.set()
        # Outside any step: only the background renewal can notice the theft, and
        # it cancels the pass here.
        try:
            await go_on.wait()
            await clock.sleep(5)
        except asyncio.CancelledError as error:
            caught.append(error)
            if not handler_swallows:
                raise
        # A handler that swallowed the cancellation still runs no further step body.
        try:
            await p.step("b", lambda: bodies.append("b"))
        except jobrun.LeaseLostError as error:
            caught.append(error)
        return jobrun.PassResult(cursor="from the stale pass")

    task = asyncio.create_task(
        jobrun.run_due_jobs(renewals, registry, driver_name="stale", clock=clock)
    )
    await asyncio.wait_for(after_first.wait(), 5)
    assert await jobrun.release_job_lease(store, run.id)
    thief = await claim_as(store, clock, "THIEF", driver="thief:1", lease_ms=60_000)
    assert thief is not None
    assert thief.id == run.id
    taken = await snapshot(store, run.id)
    # The next renewal (a quarter lease on) finds the run taken.
    clock.advance(milliseconds=50)
    assert not await asyncio.wait_for(renewals.landed.get(), 10)
    go_on.set()
    report = await task

    assert bodies == ["a"], "the step after the loss never runs"
    assert [type(error) for error in caught] == [asyncio.CancelledError] + (
        [jobrun.LeaseLostError] if handler_swallows else []
    )
    assert report.superseded == 1
    assert (report.advanced, report.completed, report.retrying, report.failed) == (0, 0, 0, 0)
    assert report.errors == []
    assert await snapshot(store, run.id) == taken, "the stale pass wrote nothing after the loss"
    row = await row_of(store, run.id)
    assert (row.lease_owner, row.cursor, row.attempts) == ("THIEF", None, 0)


# --- cancellation and graceful stop -----------------------------------------------------------


async def test_cancelling_the_driver_mid_step_hands_the_lease_back(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    entered = asyncio.Event()
    bodies: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        async def forever() -> None:
            bodies.append("b")
            entered.set()
            await asyncio.Event().wait()

        await p.step("a", lambda: bodies.append("a"))
        await p.step("b", forever)
        return jobrun.PassResult(cursor="never")

    task = asyncio.create_task(jobrun.run_due_jobs(store, registry, clock=clock))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    row = await row_of(store, run.id)
    assert_unleased(row)
    assert (row.status, row.next_attempt_at, row.attempts, row.last_error) == (
        "running",
        None,
        0,
        None,
    )
    assert row.lease_takeovers == 0
    assert set(await store.steps(run.id)) == {"a"}, "finished steps stay in the ledger"

    # Another driver takes it at once (no clock movement): no takeover, nothing charged.
    seen: list[RunRow] = []
    other = jobrun.JobRegistry()

    @other.job(M, J, lease_ms=60_000)
    async def finish(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(await row_of(store, p.run.id))
        await p.step("a", lambda: bodies.append("a again"))
        await p.step("b", lambda: bodies.append("b again"))
        return jobrun.PassResult(cursor="done", done=True)

    report = await jobrun.run_due_jobs(store, other, clock=clock, driver_name="other")
    assert report.completed == 1
    assert bodies == ["a", "b", "b again"], "the finished step is a memo hit"
    assert (seen[0].lease_takeovers, seen[0].attempts) == (0, 0)


async def test_stop_between_passes_hands_back_the_kept_lease_and_claims_nothing_new(store, clock):
    first = await jobrun.start_job_run(store, module_id=M, job=J, instance="x", clock=clock)
    clock.advance(milliseconds=1)
    second = await jobrun.start_job_run(store, module_id=M, job=J, instance="y", clock=clock)
    second_before = await snapshot(store, second.id)
    stop = asyncio.Event()
    passes: list[tuple[str, Any]] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append((p.run.instance, p.cursor))
        if p.cursor == 1:
            stop.set()
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    report = await jobrun.run_due_jobs(store, registry, clock=clock, max_passes=5, stop=stop)
    assert passes == [("x", None), ("x", 1)]
    assert (report.attempted, report.advanced, report.superseded) == (1, 2, 0)
    row = await row_of(store, first.id)
    assert_unleased(row)
    assert (row.cursor, row.next_attempt_at, row.attempts) == ("2", None, 0)
    assert await snapshot(store, second.id) == second_before, "no new run was claimed"

    # A set stop claims nothing at all.
    report = await jobrun.run_due_jobs(store, registry, clock=clock, stop=stop)
    assert report.attempted == 0
    # Both are free for any driver right now.
    report = await jobrun.run_due_jobs(store, registry, clock=clock, driver_name="next")
    assert report.attempted == 2


# --- operator actions racing a pass in flight --------------------------------------------------


Action = Callable[[Any, FakeClock, str], Awaitable[None]]


async def _cancel(store: Any, clock: FakeClock, run_id: str) -> None:
    record = await jobrun.cancel_job_run(store, run_id, "by hand", clock=clock)
    assert (record.status, record.last_error) == ("failed", "cancelled: by hand")


async def _release(store: Any, clock: FakeClock, run_id: str) -> None:
    assert await jobrun.release_job_lease(store, run_id)
    row = await row_of(store, run_id)
    assert_unleased(row)
    assert (row.status, row.next_attempt_at) == ("running", None)


async def _cancel_then_resume(store: Any, clock: FakeClock, run_id: str) -> None:
    await jobrun.cancel_job_run(store, run_id, "by hand", clock=clock)
    record = await jobrun.resume_job_run(store, run_id, clock=clock)
    assert (record.status, record.attempts, record.lease_driver) == ("running", 0, None)


async def _cancel_then_prune(store: Any, clock: FakeClock, run_id: str) -> None:
    await jobrun.cancel_job_run(store, run_id, "by hand", clock=clock)
    clock.advance(seconds=1)
    pruned = await jobrun.prune_job_runs(
        store, older_than=timedelta(0), statuses=("failed",), clock=clock
    )
    assert pruned == 1
    assert await store.get(run_id) is None
    assert await store.steps(run_id) == {}


ACTIONS = {
    "cancel": _cancel,
    "release": _release,
    "resume": _cancel_then_resume,
    "prune": _cancel_then_prune,
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_an_operator_action_during_a_pass_stands_and_the_pass_writes_nothing_after(
    store, clock, action
):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    inside = asyncio.Event()
    go_on = asyncio.Event()
    bodies: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        async def waits() -> str:
            inside.set()
            await go_on.wait()
            bodies.append("a")
            return "a"

        p.count("seen")
        await p.step("zero", lambda: bodies.append("zero"))
        await p.step("a", waits)
        await p.step("b", lambda: bodies.append("b"))
        return jobrun.PassResult(cursor="from the interrupted pass")

    task = asyncio.create_task(jobrun.run_due_jobs(store, registry, clock=clock, max_passes=3))
    await asyncio.wait_for(inside.wait(), 5)
    await ACTIONS[action](store, clock, run.id)
    after_action = await snapshot(store, run.id)
    go_on.set()
    report = await task

    assert bodies == ["zero", "a"], "the step body in flight finishes; nothing after it runs"
    assert report.superseded == 1
    assert (report.advanced, report.completed, report.retrying, report.failed) == (0, 0, 0, 0)
    assert report.errors == []
    assert await snapshot(store, run.id) == after_action, "the action's result stands"
    if action != "prune":
        row = await row_of(store, run.id)
        assert row.cursor is None
        assert row.counters == "{}"
        assert set(await store.steps(run.id)) == {"zero"}


async def test_prune_during_a_pass_leaves_the_running_run_alone(store, clock):
    registry = jobrun.JobRegistry()
    inside = asyncio.Event()
    go_on = asyncio.Event()

    @registry.job(M, J, lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if p.run.instance == "old":
            return jobrun.PassResult(done=True)

        async def waits() -> None:
            inside.set()
            await go_on.wait()

        await p.step("a", waits)
        return jobrun.PassResult(cursor="committed")

    old = await jobrun.start_job_run(store, module_id=M, job=J, instance="old", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    clock.advance(seconds=10)
    live = await jobrun.start_job_run(store, module_id=M, job=J, instance="live", clock=clock)
    task = asyncio.create_task(jobrun.run_due_jobs(store, registry, clock=clock))
    await asyncio.wait_for(inside.wait(), 5)
    pruned = await jobrun.prune_job_runs(
        store, older_than=timedelta(0), statuses=("done", "failed"), clock=clock
    )
    assert pruned == 1
    assert await store.get(old.id) is None
    go_on.set()
    report = await task
    assert (report.advanced, report.superseded) == (1, 0)
    record = await jobrun.get_job_run(store, live.id)
    assert record is not None
    assert (record.status, record.cursor) == ("running", "committed")


# --- resume ----------------------------------------------------------------------------------


async def test_resume_is_refused_while_another_run_of_the_key_is_live(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job(M, J)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    first = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    await jobrun.cancel_job_run(store, first.id, "replaced", clock=clock)
    second = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    assert second.id != first.id
    with pytest.raises(jobrun.JobConflictError) as refused:
        await jobrun.resume_job_run(store, first.id, clock=clock)
    assert refused.value.reason == "job_run_key_live"
    assert (await row_of(store, first.id)).status == "failed"
    assert (await row_of(store, second.id)).status == "running"

    await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (await row_of(store, second.id)).status == "done"
    resumed = await jobrun.resume_job_run(store, first.id, clock=clock)
    assert resumed.status == "running"
    with pytest.raises(jobrun.JobConflictError) as again:
        await jobrun.resume_job_run(store, first.id, clock=clock)
    assert again.value.reason == "job_run_not_failed"
    with pytest.raises(jobrun.JobRunNotFoundError):
        await jobrun.resume_job_run(store, "no-such-run", clock=clock)


async def test_resume_resets_attempts_and_gives_failed_steps_their_attempts_back(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    calls = {"ok": 0, "flaky": 0}
    broken = [True]
    step_retry = jobrun.RetryPolicy(max_attempts=2, base_delay_ms=0)
    registry = jobrun.JobRegistry()

    @registry.job(M, J, retry=jobrun.RetryPolicy(max_attempts=10, base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        def ok() -> str:
            calls["ok"] += 1
            return "kept"

        def flaky() -> str:
            calls["flaky"] += 1
            if broken[0]:
                raise RuntimeError("still broken")
            return "fixed"

        assert await p.step("ok", ok) == "kept"
        await p.step("flaky", flaky, step_retry)
        return jobrun.PassResult(cursor="end", done=True)

    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).retrying == 1
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).failed == 1
    failed = await row_of(store, run.id)
    assert (failed.status, failed.attempts) == ("failed", 2)
    assert calls == {"ok": 1, "flaky": 2}
    ledger = await store.steps(run.id)
    assert (ledger["flaky"].attempts, ledger["flaky"].result) == (2, None)

    resumed = await jobrun.resume_job_run(store, run.id, clock=clock)
    assert (resumed.status, resumed.attempts, resumed.ended_at) == ("running", 0, None)
    assert (resumed.next_attempt_at, resumed.lease_takeovers, resumed.lease_driver) == (
        None,
        0,
        None,
    )
    ledger = await store.steps(run.id)
    assert ledger["ok"] == StepRow("ok", '"kept"', 1, None), "a completed step keeps its memo"
    assert ledger["flaky"].attempts == 0, "a failed step gets its attempts back"
    assert ledger["flaky"].result is None

    # Still broken: the step has attempts again, so this is a retry, not an instant failure.
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.retrying, report.failed) == (1, 0)
    broken[0] = False
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.completed == 1
    assert calls == {"ok": 1, "flaky": 4}, "the completed step never ran again"


# --- prune -----------------------------------------------------------------------------------


async def test_prune_deletes_only_ended_runs_older_than_the_cutoff_in_batches(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job(M, J)
    async def finish(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    @registry.job(M, "breaks", retry=jobrun.RetryPolicy(max_attempts=1))
    async def breaks(p: jobrun.JobPass) -> None:
        await p.step("s", lambda: 1 / 0)

    origin = clock()
    # Never driven (no handler registered here): running since long before everything.
    live = await jobrun.start_job_run(store, module_id=M, job="idle", clock=clock)
    done: list[str] = []
    for index in range(5):
        clock.advance(seconds=1)
        run = await jobrun.start_job_run(
            store, module_id=M, job=J, instance=f"d{index}", clock=clock
        )
        await jobrun.run_due_jobs(store, registry, clock=clock)
        done.append(run.id)
    clock.advance(seconds=1)
    failed = await jobrun.start_job_run(store, module_id=M, job="breaks", clock=clock)
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).failed == 1
    assert set(await store.steps(failed.id)) == {"s"}
    ended = {run_id: (await row_of(store, run_id)).ended_at for run_id in done}
    assert ended[done[0]] == format_instant(origin + timedelta(seconds=1))

    clock.advance(seconds=10)  # now: origin + 16 s
    # Cutoff origin + 4 s: the runs that ended at +1, +2, +3 s go; the one at +4 s stays.
    pruned = await jobrun.prune_job_runs(
        store, older_than=timedelta(seconds=12), batch_size=2, clock=clock
    )
    assert pruned == 3
    for run_id in done[:3]:
        assert await store.get(run_id) is None
    for run_id in [*done[3:], failed.id, live.id]:
        assert await store.get(run_id) is not None
    assert await jobrun.prune_job_runs(store, older_than=timedelta(seconds=12), clock=clock) == 0

    # An aware cutoff instant works too; failed runs only when asked, with their ledgers.
    cutoff = datetime(2100, 1, 1, tzinfo=UTC)
    pruned = await jobrun.prune_job_runs(
        store, older_than=cutoff, statuses=("done", "failed"), batch_size=1, clock=clock
    )
    assert pruned == 3
    assert await store.get(failed.id) is None
    assert await store.steps(failed.id) == {}
    survivor = await row_of(store, live.id)
    assert survivor.status == "running", "a running run is never pruned"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"statuses": ("running",)}, jobrun.JobValidationError),
        ({"statuses": ()}, jobrun.JobValidationError),
        ({"statuses": ("done", "paused")}, jobrun.JobValidationError),
        ({"batch_size": 0}, ValueError),
        ({"batch_size": True}, ValueError),
        ({"older_than": timedelta(seconds=-1)}, ValueError),
        ({"older_than": 5}, TypeError),
    ],
)
async def test_prune_refuses_bad_arguments(store, clock, arguments, error):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    await jobrun.cancel_job_run(store, run.id, "x", clock=clock)
    kwargs: dict[str, Any] = {"older_than": timedelta(0), "clock": clock} | arguments
    with pytest.raises(error):
        await jobrun.prune_job_runs(store, **kwargs)
    assert await store.get(run.id) is not None


# --- health ----------------------------------------------------------------------------------


async def test_health_counts_running_due_leased_failed_and_the_oldest_wait(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job(M, "backs-off", retry=jobrun.RetryPolicy(base_delay_ms=60_000))
    async def backs_off(p: jobrun.JobPass) -> None:
        raise RuntimeError("later")

    @registry.job(M, "fails", retry=jobrun.RetryPolicy(max_attempts=1))
    async def fails(p: jobrun.JobPass) -> None:
        raise RuntimeError("never")

    @registry.job(M, "finishes")
    async def finishes(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    for job in ("backs-off", "fails", "finishes"):
        await jobrun.start_job_run(store, module_id=M, job=job, clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock, random=fixed_random)
    # Runs of a job nobody drives here: one leased, two waiting since different times.
    await jobrun.start_job_run(store, module_id=M, job=J, instance="leased", clock=clock)
    assert await claim_as(store, clock, "T", lease_ms=600_000) is not None
    clock.advance(seconds=1)
    await jobrun.start_job_run(store, module_id=M, job=J, instance="oldest", clock=clock)
    clock.advance(seconds=4)
    await jobrun.start_job_run(store, module_id=M, job=J, instance="newer", clock=clock)
    clock.advance(seconds=2)

    health = await jobrun.job_run_health(store, clock=clock)
    # running: backs-off, leased, oldest, newer; due: oldest, newer; done runs are not counted.
    assert (health.running, health.due, health.leased, health.failed) == (4, 2, 1, 1)
    assert health.oldest_due_age_s == 6.0
    clock.advance(seconds=60)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased) == (4, 3, 1), "the backoff is over"
    assert health.oldest_due_age_s == 66.0


async def test_health_of_an_empty_store_is_all_zero(store, clock):
    health = await jobrun.job_run_health(store, clock=clock)
    assert health == jobrun.JobRunHealth(0, 0, 0, 0, 0.0)


class _CommitThenHang:
    """A store whose pass commit lands, but whose caller is cancelled before hearing so.

    That is what a cancellation arriving while the database answers the commit
    looks like to the driver.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.committed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit_pass(self, run_id: str, patch: Any, token: str) -> bool:
        written = bool(await self.inner.commit_pass(run_id, patch, token))
        self.committed.set()
        await asyncio.Event().wait()
        return written


@pytest.mark.parametrize("max_passes", [1, 3])
async def test_a_cancel_that_lands_after_a_commit_does_not_undo_it(store, clock, max_passes):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    seen: list[Any] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J, lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("effect", lambda: seen.append(p.cursor))
        p.count("passes")
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    hanging = _CommitThenHang(store)
    task = asyncio.create_task(
        jobrun.run_due_jobs(hanging, registry, clock=clock, max_passes=max_passes)
    )
    await asyncio.wait_for(hanging.committed.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    row = await row_of(store, run.id)
    assert (row.cursor, row.counters, row.attempts) == ("1", '{"passes":1}', 0), (
        "the committed pass stands"
    )
    assert_unleased(row)
    assert row.next_attempt_at is None
    assert await store.steps(run.id) == {}
    await jobrun.run_due_jobs(store, registry, clock=clock)
    assert seen == [None, 1], "the committed pass is not run again"


class _SlowClaimReply:
    """A store whose claim lands at once but whose reply takes a moment to come back."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.claimed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        claimed = await self.inner.claim(request)
        if claimed is not None:
            self.claimed.set()
        # sleep: the reply's delay: the cancel lands while it is on its way
        await asyncio.sleep(0.05)
        return claimed


async def test_a_cancel_that_lands_during_a_claim_hands_the_lease_back(store, clock):
    run = await jobrun.start_job_run(store, module_id=M, job=J, clock=clock)
    ran: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job(M, J)  # the default lease: 15 minutes of nobody driving it, if leaked
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(p.run.id)
        return jobrun.PassResult()

    slow = _SlowClaimReply(store)
    task = asyncio.create_task(jobrun.run_due_jobs(slow, registry, clock=clock))
    await asyncio.wait_for(slow.claimed.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert ran == []
    row = await row_of(store, run.id)
    assert_unleased(row)
    assert (row.next_attempt_at, row.attempts, row.lease_takeovers) == (None, 0, 0)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, ran) == (1, [run.id]), "claimable at once by the next driver"


async def test_a_run_held_by_a_dead_holder_is_orphaned_and_taken_over_at_once(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    dead = dead_driver()
    assert await claim_as(store, clock, "DEAD-TOKEN", driver=dead, lease_ms=60_000)
    clock.advance(seconds=30)
    health = await jobrun.job_run_health(store, clock=clock)
    # Still leased (its lease has 30 s left), and counted apart as orphaned; not due.
    assert (health.due, health.leased, health.orphaned) == (0, 1, 1)
    assert health.oldest_due_age_s == 0.0
    registry = jobrun.JobRegistry()
    told: list[str | None] = []

    @registry.job("m", "j", lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        record = await jobrun.get_job_run(store, p.run.id)
        assert record is not None
        told.append(record.last_error)
        return jobrun.PassResult(done=True)

    # The lease has 60 s left: only the proof of death lets this driver take the run.
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert told == [f"the driver {dead} died during a pass; the run was taken over at once"]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "done"


async def test_a_dead_holder_of_a_cancelled_run_leaves_nothing_due(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    assert await claim_as(store, clock, "DEAD-TOKEN", driver=dead_driver(), lease_ms=60_000)
    await jobrun.cancel_job_run(store, run.id, "stop", clock=clock)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased, health.failed) == (0, 0, 0, 1)
