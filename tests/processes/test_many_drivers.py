"""Many drivers on one database, as real OS processes (Postgres, and SQLite: one file).

Each driver is ``tests/processes/drivers_child.py`` in its own Python process with its own
engine. Every step body of the job writes a row to a sink table that has no
unique key, so a step that ran twice is counted twice. The tests:

* several drivers drain runs of several passes each: every run done, every
  (run, pass, step) effect exactly once (the lease is comfortable, so no pass
  may overlap another), the reports summed across processes consistent, and
  nothing superseded;
* a driver SIGKILLed while it holds leases mid-step: another driver proves it
  dead and takes the runs over at once, long before the leases expire (the
  takeover latency is printed), and they finish; only the step bodies in flight
  at the kill ran twice;
* a driver paused with SIGSTOP past its lease (a zombie): another driver takes
  the run over and goes on; resumed with SIGCONT, the zombie's writes are all
  refused (superseded), the new holder's cursor and ledger stand, and the
  zombie's step effect appears at most once extra.

The size of the drain is set by environment variables; the defaults keep each
test well under 30 s on a two-core machine. The full size of the scale-out
issue (2,000 runs of 5 passes each) is::

    JOBRUN_DRIVER_RUNS=2000 JOBRUN_DRIVER_PASSES=5 \\
    JOBRUN_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \\
    .venv/bin/pytest tests/processes/test_many_drivers.py -s --timeout 900

(``-s`` shows the figures each test prints: throughput, per-driver shares,
takeover latency.)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import parse_instant
from jobrun.sql.schema import job_steps
from tests.support import Fleet

pytestmark = pytest.mark.slow

MODULE, JOB = "fleet", "walk"
RUNS = int(os.environ.get("JOBRUN_DRIVER_RUNS", "100"))
PASSES = int(os.environ.get("JOBRUN_DRIVER_PASSES", "5"))
DEADLINE_S = float(os.environ.get("JOBRUN_DRIVER_DEADLINE_S", "100"))
COUNTED = ("attempted", "advanced", "completed", "retrying", "failed", "superseded")

SQLITE = pytest.param("sqlite", id="sqlite")
POSTGRES = pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)


@pytest.fixture
async def db(database_url: str) -> Any:
    engine = create_async_engine(database_url)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "CREATE TABLE effects (run_id TEXT NOT NULL, pass_no INTEGER NOT NULL, "
                "step TEXT NOT NULL, driver TEXT NOT NULL)"
            )
        )
    try:
        yield engine
    finally:
        await engine.dispose()


async def seed(engine: AsyncEngine, count: int, prefix: str = "r") -> list[str]:
    store = jobrun.SqlJobRunStore(engine)
    ids = []
    for index in range(count):
        run = await jobrun.start_job_run(
            store, module_id=MODULE, job=JOB, instance=f"{prefix}{index:05d}"
        )
        ids.append(run.id)
    return ids


async def effects(engine: AsyncEngine) -> Counter[tuple[str, int, str]]:
    async with engine.connect() as connection:
        rows = (await connection.execute(text("SELECT run_id, pass_no, step FROM effects"))).all()
    return Counter((row.run_id, row.pass_no, row.step) for row in rows)


async def effects_by(engine: AsyncEngine) -> list[tuple[str, int, str, str]]:
    async with engine.connect() as connection:
        query = text("SELECT run_id, pass_no, step, driver FROM effects")
        rows = (await connection.execute(query)).all()
    return [(row.run_id, row.pass_no, row.step, row.driver) for row in rows]


async def ledger_rows(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(select(func.count()).select_from(job_steps))).one()[0])


def summed(reports: list[dict[str, Any]]) -> dict[str, int]:
    return {name: sum(report[name] for report in reports) for name in COUNTED}


async def assert_all_done(engine: AsyncEngine, ids: list[str], passes: int) -> None:
    store = jobrun.SqlJobRunStore(engine)
    for run_id in ids:
        row = await store.get(run_id)
        assert row is not None
        assert (row.status, row.cursor) == ("done", str(passes)), row
        assert (row.lease_owner, row.lease_driver, row.lease_began_at) == (None, None, None)
        assert (row.lease_takeovers, row.attempts, row.next_attempt_at) == (0, 0, None)
    assert await ledger_rows(engine) == 0, "every commit dropped its ledger"


def every_effect(ids: list[str], passes: int) -> set[tuple[str, int, str]]:
    return {
        (run_id, pass_no, step)
        for run_id in ids
        for pass_no in range(1, passes + 1)
        for step in ("effect", "second")
    }


# --- draining ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "drivers"),
    [
        pytest.param("sqlite", 4, id="sqlite-4"),
        pytest.param("postgres", 4, id="postgres-4", marks=pytest.mark.postgres),
        pytest.param("postgres", 8, id="postgres-8", marks=pytest.mark.postgres),
    ],
)
async def test_many_drivers_drain_every_run_exactly_once(
    backend: str, drivers: int, fleet: Fleet, db: AsyncEngine
) -> None:
    ids = await seed(db, RUNS)
    max_passes = 2
    children = [
        fleet.start(
            f"d{index}",
            "--passes",
            str(PASSES),
            "--max-passes",
            str(max_passes),
            "--lease-ms",
            "30000",
            "--wait-for-go",
            "--deadline-s",
            str(DEADLINE_S),
        )
        for index in range(drivers)
    ]
    for child in children:
        child.wait_for("ready", 60)
    started = time.monotonic()
    for child in children:
        child.go()
    reports = [child.report(timeout=DEADLINE_S + 10) for child in children]
    elapsed = time.monotonic() - started

    totals = summed(reports)
    shares = {report["name"]: report["attempted"] for report in reports}
    print(
        f"\n{backend}: {drivers} drivers, {RUNS} runs x {PASSES} passes in {elapsed:.2f} s "
        f"({RUNS * PASSES / elapsed:.0f} passes/s); totals {totals}; claims per driver {shares}"
    )
    assert not [error for report in reports for error in report["errors"]]
    assert (totals["superseded"], totals["retrying"], totals["failed"]) == (0, 0, 0)
    assert totals["completed"] == RUNS
    assert totals["advanced"] + totals["completed"] == RUNS * PASSES
    # Each claim gives a run up to max_passes passes, stopping only when it is done.
    assert totals["attempted"] == RUNS * math.ceil(PASSES / max_passes)
    assert sum(1 for share in shares.values() if share) >= 2, f"one driver did it all: {shares}"

    await assert_all_done(db, ids, PASSES)
    seen = await effects(db)
    assert set(seen) == every_effect(ids, PASSES), "every (run, pass, step) effect is there"
    duplicated = {key: count for key, count in seen.items() if count != 1}
    assert duplicated == {}, "no lease expired, so no step body ran twice"


# --- a driver killed while holding leases ------------------------------------------------------


@pytest.mark.parametrize("backend", [SQLITE, POSTGRES])
async def test_a_killed_drivers_runs_are_taken_over_at_once_and_finish(
    backend: str, fleet: Fleet, db: AsyncEngine
) -> None:
    lease_ms, passes, held = 30_000, 2, 3
    victim_runs = await seed(db, held, prefix="victim")
    victim = fleet.start(
        "victim",
        "--lease-ms",
        str(lease_ms),
        "--passes",
        str(passes),
        "--concurrency",
        str(held),
        "--sleep-s",
        "60",
    )
    # The victim holds one lease per driver loop, each blocked inside a step.
    for run_id in victim_runs:
        victim.wait_for("sleep", 30, lambda event, run_id=run_id: event["run"] == run_id)
    more_runs = await seed(db, 5, prefix="later")
    survivor = fleet.start(
        "survivor",
        "--lease-ms",
        str(lease_ms),
        "--passes",
        str(passes),
        "--observe",
        "--poll-s",
        "0.01",
    )
    survivor.wait_for("ready", 30)
    store = jobrun.SqlJobRunStore(db)
    # The survivor finishes the free runs but cannot touch the victim's while it lives.
    deadline = time.monotonic() + 30
    while len(await jobrun.job_runs(store, status="done", limit=500)) < len(more_runs):
        assert time.monotonic() < deadline, "the survivor did not drain the free runs"
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)
    for run_id in victim_runs:
        row = await store.get(run_id)
        assert row is not None
        assert row.lease_driver is not None
        assert row.lease_driver.startswith("victim-")
        assert " pid=" in row.lease_driver, "who holds it, precisely enough to prove death"
        assert (row.cursor, row.lease_takeovers) == (None, 0)

    killed_at = time.time()
    victim.process.send_signal(signal.SIGKILL)
    assert victim.process.wait(timeout=10) == -signal.SIGKILL
    # The leases the victim left behind; it renewed them until it died.
    expiries: dict[str, str] = {}
    for run_id in victim_runs:
        row = await store.get(run_id)
        assert row is not None
        assert row.next_attempt_at is not None
        expiries[run_id] = row.next_attempt_at
    report = survivor.report(timeout=60)

    takeovers = [event for event in survivor.events if event["event"] == "takeover"]
    assert sorted(event["run"] for event in takeovers) == sorted(victim_runs)
    latencies = []
    for event in takeovers:
        assert (event["takeovers"], event["attempts"], event["pass_no"]) == (1, 1, 1), event
        assert event["last_error"].startswith("the driver victim-"), event
        assert event["last_error"].endswith("died during a pass; the run was taken over at once")
        assert event["began_at"] < expiries[event["run"]], "proven dead: no wait for the expiry"
        latencies.append(parse_instant(event["began_at"]).timestamp() - killed_at)
    left = [parse_instant(expiry).timestamp() - killed_at for expiry in expiries.values()]
    print(
        f"\n{backend}: lease {lease_ms} ms, takeover latency after SIGKILL "
        f"(kill -> claim) min {min(latencies):.3f} s, max {max(latencies):.3f} s; "
        f"the leases had {min(left):.3f} to {max(left):.3f} s left at the kill"
    )
    # The holder was proven dead (its process is gone from this host; on Postgres
    # its presence lock too): taken over at the survivor's next look, about a
    # second at most, never waiting for the leases to run out.
    assert max(latencies) <= 5.0

    totals = summed([report])
    assert (totals["superseded"], totals["failed"], totals["retrying"]) == (0, 0, 0)
    assert totals["completed"] == held + 5
    await assert_all_done(db, victim_runs + more_runs, passes)
    seen = await effects(db)
    assert set(seen) == every_effect(victim_runs + more_runs, passes)
    duplicated = {key: count for key, count in seen.items() if count != 1}
    # Only the step bodies in flight at the kill ran twice: once by each driver.
    assert duplicated == {(run_id, 1, "effect"): 2 for run_id in victim_runs}


# --- a zombie: paused past its lease, then resumed ----------------------------------------------


@pytest.mark.parametrize("backend", [SQLITE, POSTGRES])
async def test_a_resumed_zombie_is_refused_and_the_new_holder_stands(
    backend: str, fleet: Fleet, db: AsyncEngine
) -> None:
    lease_ms, passes = 1000, 3
    [run_id] = await seed(db, 1)
    store = jobrun.SqlJobRunStore(db)
    zombie = fleet.start(
        "zombie",
        "--lease-ms",
        str(lease_ms),
        "--passes",
        str(passes),
        "--sleep-pass",
        "1",
        "--sleep-s",
        "2",
        "--once",
    )
    zombie.wait_for("sleep", 30)
    zombie.process.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()

    holder = fleet.start(
        "holder",
        "--lease-ms",
        str(lease_ms),
        "--passes",
        str(passes),
        "--max-passes",
        "3",
        "--sleep-pass",
        "2",
        "--sleep-step",
        "second",
        "--sleep-s",
        "3",
        "--observe",
        "--poll-s",
        "0.01",
    )
    taken = holder.wait_for("takeover", 30)
    assert (taken["run"], taken["takeovers"], taken["attempts"]) == (run_id, 1, 1)
    # Stopped, not dead: nothing proves otherwise, so its lease had to expire.
    assert taken["last_error"].startswith("the lease of driver zombie-0 [jobrun ")
    assert taken["last_error"].endswith("] expired during a pass; the run was taken over")
    # The holder is now inside pass 2's second step, its ledger holding pass 2's first step.
    holder.wait_for("sleep", 30)
    held = await store.get(run_id)
    assert held is not None
    assert held.cursor == "1"
    assert (held.lease_driver or "").startswith("holder-0 [jobrun ")
    ledger_before = await store.steps(run_id)
    assert json.loads(ledger_before["effect"].result or "null") == {
        "driver": "holder-0",
        "pass": 2,
    }

    paused_for = time.monotonic() - stopped_at
    zombie.process.send_signal(signal.SIGCONT)
    zombie_report = zombie.report(timeout=30)
    print(
        f"\n{backend}: zombie paused {paused_for:.2f} s past a {lease_ms} ms lease; "
        f"its report {summed([zombie_report])}"
    )
    assert summed([zombie_report]) == {
        "attempted": 1,
        "advanced": 0,
        "completed": 0,
        "retrying": 0,
        "failed": 0,
        "superseded": 1,
    }
    assert zombie_report["errors"] == []
    # The holder is still in its step: nothing the zombie tried landed.
    assert await store.steps(run_id) == ledger_before
    row = await store.get(run_id)
    assert row is not None
    assert (row.cursor, row.lease_driver, row.lease_owner) == (
        "1",
        held.lease_driver,
        held.lease_owner,
    )

    holder_report = holder.report(timeout=60)
    assert summed([holder_report]) == {
        "attempted": 1,
        "advanced": 2,
        "completed": 1,
        "retrying": 0,
        "failed": 0,
        "superseded": 0,
    }
    await assert_all_done(db, [run_id], passes)
    rows = await effects_by(db)
    by_zombie = [row for row in rows if row[3] == "zombie-0"]
    assert by_zombie == [(run_id, 1, "effect", "zombie-0")], "one extra effect at most"
    by_holder = Counter(row[:3] for row in rows if row[3] == "holder-0")
    assert by_holder == Counter(every_effect([run_id], passes))
