"""Promises that once broke without any test noticing, each pinned by a test here.

* A pass commit whose fence misses (the lease was taken away meanwhile) writes
  nothing at all: in particular it leaves the new holder's step ledger alone.
* The lease renewer of a pass ends with the pass: ``run_due_jobs`` leaves no task
  of its own behind and no renewal is sent after it returns.
* The worker hands its ``stop`` event down to ``run_due_jobs``: once it is set, no
  further run is claimed.

Every test is deterministic: leases are taken away by hand (a takeover by a
claimer whose clock is past the expiry, or a release and a fresh claim), never by
racing a real clock. Each was checked by reintroducing the breakage it names and seeing
it fail (see ``tests/README.md``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import RunPatch, RunRow, StepRow
from jobrun.sql.schema import job_runs
from tests.support import SQL_BACKENDS, RecordingStore, claim_as, row_of, snapshot, start

M, J = "m", "j"


def finishing_patch(at: str) -> RunPatch:
    """What a pass that completes its run writes."""
    return RunPatch(
        status="done",
        cursor='"finished"',
        counters='{"n":1}',
        attempts=0,
        last_error=None,
        updated_at=at,
        next_attempt_at=None,
        ended_at=at,
    )


async def take_lease_away(store: Any, clock: Any, run_id: str, lost_by: str) -> RunRow:
    """Give the run to a new holder "NEW", as an expiry or an operator would."""

    def claimer_clock() -> datetime:
        # A takeover: two seconds on, past the 1 s lease, for the new claimer only. The
        # holder's renewer sleeps on the test clock, so it cannot renew between the
        # claim's read and its write (a renewal landing there keeps the lease, rightly).
        return clock() + timedelta(seconds=2 if lost_by == "takeover" else 0)

    if lost_by != "takeover":
        assert await jobrun.release_job_lease(store, run_id)
    taken = await claim_as(store, claimer_clock, "NEW", driver="new:1", lease_ms=60_000, job=(M, J))
    assert taken is not None
    assert (taken.id, taken.lease_owner) == (run_id, "NEW")
    return taken


# --- (a) a commit whose fence missed writes nothing ---------------------------------------------


@pytest.mark.parametrize("lost_by", ["takeover", "release"])
async def test_a_commit_with_a_lost_token_leaves_the_new_holders_ledger(store, clock, lost_by):
    run = await start(store, clock, module_id=M, job=J)
    assert await claim_as(store, clock, "OLD", job=(M, J)) is not None
    at = format_instant(clock())
    assert await store.record_step(run.id, StepRow("a", '"old"', 1, None), at, "OLD")
    await take_lease_away(store, clock, run.id, lost_by)
    assert await store.record_step(run.id, StepRow("b", '"new"', 1, None), at, "NEW")
    before = await snapshot(store, run.id)
    assert set(before[1]) == {"a", "b"}

    assert not await store.commit_pass(run.id, finishing_patch(at), "OLD")

    assert await snapshot(store, run.id) == before, "the missed commit changed the run or ledger"
    # And the fence is still exact: the holder's own commit drops the ledger.
    assert await store.commit_pass(run.id, finishing_patch(at), "NEW")
    assert await store.steps(run.id) == {}


@pytest.mark.parametrize("lost_by", ["takeover", "release"])
async def test_a_pass_that_lost_its_lease_before_committing_leaves_the_new_ledger(
    store, clock, lost_by
):
    """The same through ``run_due_jobs``: the path users run (the store's one executor)."""
    run = await start(store, clock, module_id=M, job=J)
    stepped = asyncio.Event()
    go_on = asyncio.Event()
    registry = jobrun.JobRegistry()

    # A long lease: its renewal (every quarter lease, real time) never fires here.
    @registry.job(M, J, lease_ms=1000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: "old")
        stepped.set()
        await go_on.wait()
        return jobrun.PassResult(cursor="from the stale pass", done=True)

    driving = asyncio.create_task(jobrun.run_due_jobs(store, registry, clock=clock))
    await asyncio.wait_for(stepped.wait(), 10)
    await take_lease_away(store, clock, run.id, lost_by)
    at = format_instant(clock())
    assert await store.record_step(run.id, StepRow("b", '"new"', 1, None), at, "NEW")
    before = await snapshot(store, run.id)
    go_on.set()
    report = await asyncio.wait_for(driving, 10)

    assert (report.superseded, report.completed, report.advanced) == (1, 0, 0)
    assert await snapshot(store, run.id) == before
    assert set(before[1]) == {"a", "b"}, "the new holder's ledger was dropped"


# --- (b) the renewer ends with its pass ---------------------------------------------------------


@pytest.mark.parametrize("max_passes", [1, 3])
@pytest.mark.parametrize("ending", ["advance", "done", "raise", "superseded"])
async def test_no_task_of_a_drive_outlives_it(store, clock, max_passes, ending):
    """Whatever way a pass ends, its renewal task is gone when ``run_due_jobs`` returns."""
    # Renewals wait on the pass's clock, moved by hand below: autojump would also move
    # it while a renewal awaits the database, which the self-fence reads as a stall.
    for instance in ("x", "y"):
        await start(store, clock, module_id=M, job=J, instance=instance)
    registry = jobrun.JobRegistry()
    counting = RecordingStore(store)
    renewed = asyncio.Event()

    async def tell_renewed(*_: Any) -> None:
        renewed.set()

    counting.after["extend_lease"] = tell_renewed

    # The shortest lease: renewals every 25 ms of the clock, so the renewer is running.
    @registry.job(M, J, lease_ms=100)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step(f"s{p.cursor}", lambda: 1)
        if ending == "superseded":
            assert await jobrun.release_job_lease(store, p.run.id)
        # Wait for a renewal (or the renewer finding the lease gone) to be sure it ran.
        # The renewer waits on the clock once it has run (on the memory store, not yet).
        await asyncio.sleep(0)
        clock.advance(milliseconds=25)
        await asyncio.wait_for(renewed.wait(), 10)
        renewed.clear()
        if ending == "raise":
            raise RuntimeError("handler broke")
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1, done=ending == "done")

    # The presence (Postgres) is the store's, with its own checker task: opened first.
    await store.presence()
    before = asyncio.all_tasks()
    report = await jobrun.run_due_jobs(counting, registry, clock=clock, max_passes=max_passes)
    left = {task for task in asyncio.all_tasks() - before if not task.done()}
    assert report.attempted == 2
    # Every pass ended the way this case says (not by the 10 s wait failing it).
    outcome = {"advance": "advanced", "done": "completed", "raise": "retrying"}.get(ending, ending)
    assert getattr(report, outcome) >= 2, report
    assert left == set(), f"tasks outlived run_due_jobs: {left}"
    # Belt and braces: nothing renews later either (a leftover renewer sleeps 25 ms).
    sent = counting.count("extend_lease")
    # sleep: a look for a renewal that must not come (load cannot fake one)
    await asyncio.sleep(0.1)
    assert counting.count("extend_lease") == sent, "a renewal was sent after run_due_jobs returned"


# --- (c) the worker's stop reaches run_due_jobs -------------------------------------------------


WORKER_BACKENDS = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)


@WORKER_BACKENDS
@pytest.mark.parametrize("max_passes", [1, 2])
async def test_after_stop_the_worker_claims_no_new_run(database_url: str, max_passes: int):
    """Stop is set while the first pass runs: that pass finishes, nothing else is claimed."""
    engine: AsyncEngine = create_async_engine(database_url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        ids = [
            (await jobrun.start_job_run(store, module_id=M, job=J, instance=f"i{n}")).id
            for n in range(6)
        ]
        stop = asyncio.Event()
        inside = asyncio.Event()
        passes: list[str] = []
        registry = jobrun.JobRegistry()

        @registry.job(M, J)
        async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
            passes.append(p.run.id)
            inside.set()
            await stop.wait()
            return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

        worker = asyncio.create_task(
            jobrun.run_worker(
                [engine], registry, stop=stop, interval_s=0.2, max_passes=max_passes, limit=50
            )
        )
        await asyncio.wait_for(inside.wait(), 30)
        stop.set()
        await asyncio.wait_for(worker, 30)

        assert len(passes) == 1, f"passes after stop: {passes}"
        async with engine.connect() as connection:
            rows = (await connection.execute(select(job_runs).order_by(job_runs.c.id))).all()
        untouched = [row for row in rows if row.id != passes[0]]
        assert len(untouched) == len(ids) - 1
        for row in untouched:
            assert (row.lease_owner, row.lease_driver, row.cursor) == (None, None, None)
            assert row.updated_at == row.started_at
            assert row.next_attempt_at is None
        first = await row_of(store, passes[0])
        assert (first.cursor, first.lease_owner) == ("1", None)
    finally:
        await engine.dispose()
