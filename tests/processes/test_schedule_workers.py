"""Schedules, limits and retention in real workers, on SQLite and Postgres.

Three ``jobrun worker`` processes share one database with a two-second schedule:
each slot gets one run, however many workers look. The slot's lateness (the
run's start after the slot's instant) is printed for the record, not asserted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._api import SYSTEM_SOURCES
from jobrun._core.model.formats import format_instant, parse_instant
from jobrun._core.model.records import RunRow
from jobrun._core.operator.retention import prune_by_retention
from jobrun.sql.schema import job_schedules
from tests.processes import schedule_app
from tests.support import SQL_BACKENDS, hand_made_row, put_rows, spawn_worker

APP = "tests.processes.schedule_app:registry"
WORKERS = 3
SLOTS = 4  # about eight seconds of three workers racing for each two-second slot


def spawn(url: str) -> subprocess.Popen[str]:
    return spawn_worker(APP, "--url", url, "--interval", "0.5")


def started(process: subprocess.Popen[str]) -> None:
    """Read the worker's log until it says it started (it then looks at the schedules)."""
    assert process.stderr is not None
    while "worker started" not in (line := process.stderr.readline()):
        assert line, "the worker exited before it started"


async def until_slots(store: jobrun.SqlJobRunStore, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(await jobrun.job_runs(store, job="every2s", limit=500)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} slots in {timeout_s} s"
        await asyncio.sleep(0.1)  # a poll interval, not a wait for the event


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_three_workers_start_each_slot_once_and_only_once(
    database_url: str, store: jobrun.SqlJobRunStore, engine: AsyncEngine
):
    workers = [spawn(database_url) for _ in range(WORKERS)]
    try:
        for process in workers:
            await asyncio.wait_for(asyncio.to_thread(started, process), 60)
        # Until the schedule has made that many slots' runs; 120 s only bounds a hang.
        await until_slots(store, SLOTS, timeout_s=120)
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        outputs = [await asyncio.to_thread(process.communicate, timeout=30) for process in workers]
    for process, (_out, err) in zip(workers, outputs, strict=True):
        assert process.returncode == 0, err
    runs = [run for run in await jobrun.job_runs(store, limit=500) if run.job == "every2s"]
    slots = sorted(parse_instant(run.instance) for run in runs)
    # One run per slot: no slot twice, and none skipped between the first and the last.
    assert len(slots) == len(set(slots))
    assert len(slots) >= SLOTS
    assert all(later - earlier == timedelta(seconds=2) for earlier, later in pairwise(slots))
    assert all(slot.second % 2 == 0 and slot.microsecond == 0 for slot in slots)
    assert {run.payload["from"] for run in runs} == {"schedule"}
    async with engine.connect() as connection:
        recorded = (await connection.execute(select(job_schedules))).mappings().one()
    assert recorded["last_slot_at"] == format_instant(slots[-1])
    late_ms = sorted(
        (run.started_at - parse_instant(run.instance)).total_seconds() * 1000 for run in runs
    )
    print(
        f"\n{len(runs)} slots on {engine.dialect.name}: started after their instant by "
        f"median {late_ms[len(late_ms) // 2]:.1f} ms, max {late_ms[-1]:.1f} ms"
    )
    assert late_ms[0] >= 0


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_a_limited_job_never_exceeds_its_limit_with_twelve_drivers(
    store: jobrun.SqlJobRunStore, engine: AsyncEngine
):
    schedule_app.most_in_flight = 0
    ids = [
        (
            await jobrun.start_job_run(
                store, module_id="clock", job="limited", instance=f"i{n}", payload={"sleep_s": 0.3}
            )
        ).id
        for n in range(8)
    ]
    stop = asyncio.Event()
    leased_counts: list[int] = []

    async def watch() -> None:
        # The database's view too, not only the handler's: leased runs of the job.
        while not stop.is_set():
            runs = await jobrun.job_runs(store, job="limited", status="running")
            leased_counts.append(sum(run.lease_driver is not None for run in runs))
            if not runs:
                stop.set()
            # sleep: a poll interval of the watcher
            await asyncio.sleep(0.02)

    worker = asyncio.create_task(
        jobrun.run_worker(
            [engine], schedule_app.registry, concurrency=12, interval_s=0.1, stop=stop
        )
    )
    await asyncio.wait_for(watch(), 60)
    await asyncio.wait_for(worker, 10)
    assert {run.status for run in await jobrun.job_runs(store, job="limited")} == {"done"}
    assert len(ids) == 8
    assert schedule_app.most_in_flight == 2
    assert max(leased_counts) <= 2


def _finished(
    number: int, job: str, status: str, ended_at: datetime, module_id: str = "clock"
) -> RunRow:
    """A run of ``job`` that ended (or, running, started) at ``ended_at``."""
    text = format_instant(ended_at)
    return dataclasses.replace(
        hand_made_row(number, module_id=module_id, job=job),
        status=status,
        ended_at=None if status == "running" else text,
        updated_at=text,
        started_at=text,
    )


NOW = datetime(2026, 6, 1, tzinfo=UTC)


async def test_retention_deletes_only_what_it_should(store: Any, engine: AsyncEngine | None):
    ago = lambda **delta: NOW - timedelta(**delta)  # noqa: E731
    rows = {
        "kept job, two days": (_finished(1, "kept", "done", ago(days=2)), False),
        "kept job, failed two days": (_finished(2, "kept", "failed", ago(days=2)), False),
        "kept job, an hour": (_finished(3, "kept", "done", ago(hours=1)), True),
        "other job, ten days": (_finished(4, "every2s", "done", ago(days=10)), False),
        "other job, failed ten days": (_finished(5, "every2s", "failed", ago(days=10)), False),
        "other job, three days": (_finished(6, "every2s", "done", ago(days=3)), True),
        # Another app's job: not this worker's to prune (issue 23, item 7).
        "unregistered, ten days": (_finished(7, "theirs", "done", ago(days=10), "else"), True),
        "running, started long ago": (_finished(8, "every2s", "running", ago(days=30)), True),
        # keep_for (a day) wins over prune_after (a week) for its job, both ways.
        "kept job, eight days": (_finished(9, "kept", "done", ago(days=8)), False),
    }
    await put_rows(store, engine, [row for row, _ in rows.values()])
    deleted = await prune_by_retention(
        store,
        schedule_app.registry,
        prune_after=timedelta(days=7),
        clock=lambda: NOW,
        sources=SYSTEM_SOURCES,
    )
    remaining = {run.id for run in await jobrun.job_runs(store, limit=500)}
    assert {name for name, (row, _) in rows.items() if row.id in remaining} == {
        name for name, (_, kept) in rows.items() if kept
    }
    assert deleted == sum(not kept for _, kept in rows.values())
    # Without prune_after only keep_for applies.
    await put_rows(store, engine, [_finished(10, "every2s", "done", ago(days=400))])
    assert (
        await prune_by_retention(
            store,
            schedule_app.registry,
            prune_after=None,
            clock=lambda: NOW,
            sources=SYSTEM_SOURCES,
        )
        == 0
    )


@pytest.mark.parametrize("backend", SQL_BACKENDS[:1], indirect=True)
async def test_the_worker_prunes_at_start(store: jobrun.SqlJobRunStore, engine: AsyncEngine):
    old = _finished(1, "every2s", "done", datetime.now(UTC) - timedelta(days=40))
    recent = _finished(2, "every2s", "done", datetime.now(UTC) - timedelta(days=1))
    # Another app's job, as old: not this worker's to prune (issue 23, item 7).
    theirs = _finished(3, "invoice", "done", datetime.now(UTC) - timedelta(days=40), "billing")
    await put_rows(store, engine, [old, recent, theirs])
    stop = asyncio.Event()
    worker = asyncio.create_task(
        jobrun.run_worker(
            [engine], schedule_app.registry, prune_after=timedelta(days=30), stop=stop
        )
    )
    deadline = time.monotonic() + 10
    while await store.get(old.id) is not None:
        assert time.monotonic() < deadline, "not pruned"
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(worker, 10)
    assert await store.get(recent.id) is not None
    # Its own jobs are pruned last in a round: the round was over when `old` went.
    assert await store.get(theirs.id) is not None
