"""Contract tests for versioned jobs: a job's code changes while its runs are in flight.

A run stores the version of the code that last committed it (NULL: 1). A driver
never claims a run of a version newer than its code's, orphaned or not; a pass
of newer code upgrades the stored cursor through each upgrade function in order,
drops the older code's ledger (its memos never answer the new code's steps) and
commits the new version; an upgrade function that raises is a failed attempt.
Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun._core.rules.versions import runs_beyond_code
from jobrun.testing import FakeClock
from tests.support import JOB, drive, row_of, set_columns, start_id
from tests.support import MODULE_ID as MODULE

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0, max_attempts=3)


def registry_of(handler: Any, **options: Any) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE, **options)
    return registry


def counting(seen: list[Any]) -> Any:
    """A handler that records the cursor it is given and commits it plus one."""

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.cursor)
        return jobrun.PassResult(cursor={"n": (p.cursor or {"n": 0})["n"] + 1})

    return handler


async def test_a_driver_never_claims_a_run_committed_by_newer_code(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    seen: list[Any] = []
    run_id = await start_id(store, clock)
    # Committed by version-2 code (say, before a rollback to version 1).
    await set_columns(store, engine, run_id, job_version=2, cursor='{"n": 5}')
    report = await drive(store, registry_of(counting(seen)), clock)
    assert report.attempted == 0
    assert seen == []
    # Version-2 code takes it; a version-3 driver too, upgrading it.
    again = await drive(store, registry_of(counting(seen), version=2, upgrade={1: dict}), clock)
    assert (again.attempted, again.advanced) == (1, 1)
    assert seen == [{"n": 5}]
    assert (await row_of(store, run_id)).job_version == 2


async def test_an_orphan_of_a_newer_version_is_not_taken_over(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    run_id = await start_id(store, clock)
    now_at = format_instant(clock.now())
    later_at = format_instant(clock.now().replace(year=2100))
    # Leased by a holder proven dead, committed by version-2 code.
    await set_columns(
        store,
        engine,
        run_id,
        job_version=2,
        lease_owner="DEAD",
        lease_driver="gone",
        next_attempt_at=later_at,
    )
    expires = {(MODULE, JOB): later_at}
    old = ClaimRequest(now_at, "NEW", "me", expires, dead_owners=frozenset({"DEAD"}))
    assert await store.claim(old) is None
    newer = ClaimRequest(
        now_at, "NEW", "me", expires, dead_owners=frozenset({"DEAD"}), versions={(MODULE, JOB): 2}
    )
    claimed = await store.claim(newer)
    assert claimed is not None
    assert (claimed.row.id, claimed.row.lease_owner) == (run_id, "NEW")


async def test_a_pass_upgrades_the_cursor_through_each_function_in_order(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    calls: list[int] = []

    def from_1(cursor: Any) -> Any:
        calls.append(1)
        return {"position": cursor["n"]}

    def from_2(cursor: Any) -> Any:
        calls.append(2)
        return {"position": cursor["position"], "shard": 0}

    seen: list[Any] = []
    run_id = await start_id(store, clock)
    # Version-1 code commits a pass first: its cursor is of version 1.
    assert (await drive(store, registry_of(counting(seen)), clock)).advanced == 1
    assert (await row_of(store, run_id)).job_version == 1

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.cursor)
        return jobrun.PassResult(cursor=jobrun.KEEP_CURSOR)

    registry = registry_of(handler, version=3, upgrade={2: from_2, 1: from_1})
    report = await drive(store, registry, clock)
    assert (report.attempted, report.advanced) == (1, 1)
    assert calls == [1, 2]
    assert seen == [None, {"position": 1, "shard": 0}]
    row = await row_of(store, run_id)
    # KEEP_CURSOR keeps the upgraded cursor, not the stored one of version 1.
    assert json.loads(row.cursor or "null") == {"position": 1, "shard": 0}
    assert (row.job_version, row.passes_committed) == (3, 2)
    run = await jobrun.get_job_run(store, run_id)
    assert run is not None
    assert run.job_version == 3
    # The next pass of the same code upgrades nothing.
    await drive(store, registry, clock)
    assert calls == [1, 2]


async def test_a_failing_upgrade_is_a_failed_attempt(store: Any, clock: FakeClock) -> None:
    run_id = await start_id(store, clock)
    seen: list[Any] = []
    assert (await drive(store, registry_of(counting(seen)), clock)).advanced == 1
    before = await row_of(store, run_id)

    def broken(cursor: Any) -> Any:
        raise KeyError("position")

    report = await drive(store, registry_of(counting(seen), version=2, upgrade={1: broken}), clock)
    assert (report.attempted, report.retrying) == (1, 1)
    assert [error.error for error in report.errors] == ["KeyError: 'position'"]
    row = await row_of(store, run_id)
    # Charged like any failed pass; nothing of the upgrade was written.
    assert (row.attempts, row.last_error) == (1, "KeyError: 'position'")
    assert (row.cursor, row.job_version) == (before.cursor, 1)
    assert row.lease_owner is None
    # Fixed, the same run upgrades and goes on.
    fixed = registry_of(counting(seen), version=2, upgrade={1: lambda cursor: cursor})
    assert (await drive(store, fixed, clock)).advanced == 1
    assert ((await row_of(store, run_id)).job_version, seen[-1]) == (2, {"n": 1})


async def test_the_older_codes_ledger_never_answers_the_new_codes_steps(
    store: Any, clock: FakeClock
) -> None:
    bodies: list[str] = []

    def body(name: str) -> Any:
        def run() -> str:
            bodies.append(name)
            return name

        return run

    async def version_1(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fetch", body("old fetch"))
        raise RuntimeError("died after the step")

    run_id = await start_id(store, clock)
    assert (await drive(store, registry_of(version_1), clock)).retrying == 1
    assert set(await store.steps(run_id)) == {"fetch"}

    fails = {"left": 1}

    async def version_2(p: jobrun.JobPass) -> jobrun.PassResult:
        fetched = await p.step("fetch", body("new fetch"))
        await p.step("send", body("new send"))
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("after both steps")
        return jobrun.PassResult(cursor=fetched, done=True)

    registry = registry_of(version_2, version=2, upgrade={1: lambda cursor: cursor})
    assert (await drive(store, registry, clock)).retrying == 1
    # The reused step name ran again under the new code: the old memo was dropped.
    assert bodies == ["old fetch", "new fetch", "new send"]
    row = await row_of(store, run_id)
    assert (row.job_version, row.passes_committed, row.attempts) == (2, 0, 2)
    # The new code's own ledger is kept for its retry, which replays it.
    assert (await drive(store, registry, clock)).completed == 1
    assert bodies == ["old fetch", "new fetch", "new send"]
    done = await row_of(store, run_id)
    assert (done.status, done.cursor, done.job_version) == ("done", '"new fetch"', 2)


async def test_a_commit_writes_the_codes_version_and_health_counts_runs_by_version(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    seen: list[Any] = []
    first = await start_id(store, clock, instance="a")
    second = await start_id(store, clock, instance="b")
    third = await start_id(store, clock, instance="c")
    # Not committed yet: no version stored (it reads as 1).
    assert (await row_of(store, first)).job_version is None
    assert (await drive(store, registry_of(counting(seen)), clock, limit=1)).advanced == 1
    assert (await row_of(store, first)).job_version == 1
    await set_columns(store, engine, second, job_version=3)
    await set_columns(store, engine, third, job_version=2)

    health = await jobrun.job_run_health(store, by_job=True, clock=clock)
    assert health.versions_by_job == {(MODULE, JOB): {1: 1, 2: 1, 3: 1}}
    # Version-2 code never takes the version-3 run: health says what would.
    assert runs_beyond_code(health.versions_by_job, {(MODULE, JOB): 2}) == {(MODULE, JOB): (1, 3)}
    assert runs_beyond_code(health.versions_by_job, {(MODULE, JOB): 3}) == {}
    registry = registry_of(counting(seen), version=2, upgrade={1: dict})
    report = await drive(store, registry, clock, max_passes=1)
    assert report.attempted == 2
    assert [(await row_of(store, run_id)).job_version for run_id in (first, second, third)] == [
        2,
        3,
        2,
    ]
    # Without by_job there is no such read.
    assert (await jobrun.job_run_health(store, clock=clock)).versions_by_job == {}
