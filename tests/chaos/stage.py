"""One chaos scenario, start to finish: database, runs, drivers, fault, referee, clean-up.

A :class:`Fault` has three moments: ``before_database`` (e.g. a throwaway
cluster or a role), ``before_drivers`` (e.g. a database setting, a proxy) and
``inject`` (the fault itself, usually while a driver is inside a step body).
Everything it sets up goes on the stage's exit stack, so it is undone whatever
happens; the drivers are stopped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.chaos.referee import Segment, Verdict, judge
from tests.support import Child

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "processes" / "chaos_child.py"
LEASE_MS = 3000
BODY_MS = 100  # bodies sleep 100 or 200 ms


def url_with(url: str, **parts: Any) -> str:
    return make_url(url).set(**parts).render_as_string(hide_password=False)


async def admin(url: str, *statements: str) -> list[Any]:
    """Run statements in autocommit on ``url``; the first column of each last row."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    found: list[Any] = []
    try:
        async with engine.connect() as connection:
            for statement in statements:
                result = await connection.exec_driver_sql(statement)
                row = result.first() if result.returns_rows else None
                found.append(None if row is None else row[0])
    finally:
        await engine.dispose()
    return found


@dataclass
class Stage:
    """What a fault sees and leaves: the databases, the drivers, and what it did when."""

    backend: str
    workdir: Path
    server_url: str  # Postgres: where databases are created
    stack: contextlib.AsyncExitStack
    url: str = ""  # the scenario's database, direct
    database: str = ""
    owner: str = ""  # Postgres: role that owns the database and that drivers log in as
    sqlite_dir: Path | None = None
    driver_urls: dict[int, str] = field(default_factory=dict)
    # Extra environment per driver (a fault's clock, say), over this process's own.
    driver_env: dict[int, dict[str, str]] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    log: Path = Path()
    pauses: dict[int, list[Segment]] = field(default_factory=dict)
    deaths: dict[int, int] = field(default_factory=dict)
    resume_from_ns: int | None = None
    affected_runs: set[str] | None = None
    notes: list[str] = field(default_factory=list)
    passes: int = 6

    async def victim_body(
        self, only: Child | None = None, timeout_s: float = 60.0
    ) -> tuple[Child, dict[str, Any]]:
        """A driver that is inside a body of its run's middle passes (not the first, nor
        the last two), right now."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for child in [only] if only else self.children:
                fresh_ns = time.monotonic_ns() - 60_000_000

                def wanted(event: dict[str, Any], fresh_ns: int = fresh_ns) -> bool:
                    pass_no = int(event["step"][1:].split(".")[0])
                    return 2 <= pass_no <= self.passes - 2 and event["ns"] > fresh_ns

                with contextlib.suppress(AssertionError):
                    return child, await asyncio.to_thread(child.wait_for, "body", 0.05, wanted)
        raise AssertionError("no driver entered a middle pass of its run in time")


class Fault:
    """A fault; subclasses override the moments they need."""

    name = "fault"
    backends: tuple[str, ...] = ("sqlite", "postgres")
    quick = False
    passes = 6
    deadline_s = 60.0
    # The fault is aimed at the first driver: it must hold a run, so it starts alone.
    first_driver_alone = False
    # Runs started, their lease, and whether the drivers (of chaos_child.py) are
    # run_worker processes (``jobrun worker`` as deployed) rather than run_due_jobs loops.
    runs = 2
    lease_ms = LEASE_MS
    worker_drivers = False
    # The quick set asserts that the affected runs resumed within this (None: not asked).
    resume_within_s: float | None = None
    # What a driver runs: a run_due_jobs loop, or (tests/processes/chaos_worker.py) a worker.
    driver_script = CHILD

    async def before_database(self, stage: Stage) -> None:
        pass

    async def before_drivers(self, stage: Stage) -> None:
        pass

    async def inject(self, stage: Stage) -> None:
        pass


@dataclass
class Outcome:
    scenario: str
    backend: str
    verdict: Verdict
    runs: int = 0
    lost: int = 0
    failed: int = 0
    notes: list[str] = field(default_factory=list)
    error: str = ""


async def _make_database(stage: Stage) -> None:
    if stage.backend == "sqlite":
        directory = stage.sqlite_dir or stage.workdir
        stage.url = f"sqlite+aiosqlite:///{directory / 'chaos.db'}"
    else:
        stage.database = f"jobrun_chaos_{uuid.uuid4().hex[:10]}"
        owner = f' OWNER "{stage.owner}"' if stage.owner else ""
        await admin(stage.server_url, f'CREATE DATABASE "{stage.database}"{owner}')
        drop = f'DROP DATABASE IF EXISTS "{stage.database}" WITH (FORCE)'

        async def drop_database() -> None:
            # The server read at the end: a failover fault moves it to the promoted one.
            await admin(stage.server_url, drop)

        stage.stack.push_async_callback(drop_database)
        user = {"username": stage.owner} if stage.owner else {}
        stage.url = url_with(stage.server_url, database=stage.database, **user)


async def _start_runs(url: str, count: int) -> list[str]:
    engine = create_async_engine(url)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        runs = [
            await jobrun.start_job_run(store, module_id="chaos", job="walk", instance=f"r{index}")
            for index in range(count)
        ]
        return [run.id for run in runs]
    finally:
        await engine.dispose()


def _start_drivers(stage: Stage, fault: Fault, drivers: int) -> None:
    def stop_all() -> None:
        for child in stage.children:
            child.stop()

    stage.stack.callback(stop_all)
    # The drivers must import this checkout's jobrun, not whatever the virtualenv points at.
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, paths)])
    for index in range(drivers):
        child = start_driver(stage, fault, index)
        if index == 0 and fault.first_driver_alone:
            child.wait_for("body", 60)  # it holds a run before the others start
    for child in stage.children:
        child.wait_for("ready", 60)


def start_driver(stage: Stage, fault: Fault, index: int) -> Child:
    """Driver ``d{index}``, started now (a fault may start one late), watched for its exit."""
    options = ["--log", str(stage.log), "--lease-ms", str(fault.lease_ms)]
    options += ["--worker"] if fault.worker_drivers else []
    # One claim covers a whole run: a holder keeps its lease for seconds, the spare driver polls.
    options += ["--passes", str(fault.passes), "--max-passes", str(fault.passes)]
    options += ["--body-ms", str(BODY_MS), "--deadline-s", str(fault.deadline_s)]
    url = stage.driver_urls.get(index, stage.url)
    env = dict(os.environ, **stage.driver_env[index]) if index in stage.driver_env else None
    child = Child(f"d{index}", url, stage.workdir, *options, script=fault.driver_script, env=env)
    stage.children.append(child)
    threading.Thread(target=_note_exit, args=(stage, child), daemon=True).start()
    return child


def _note_exit(stage: Stage, child: Child) -> None:
    """When a driver exits (a body without an end line ends there, if no kill was noted)."""
    child.process.wait()
    stage.deaths.setdefault(child.process.pid, time.monotonic_ns())


async def _wait_for_drivers(stage: Stage, deadline_s: float) -> dict[str, int]:
    """Each driver's report (the dead ones have none); totals of a few counters."""
    totals = {"store_errors": 0, "superseded": 0, "taken_over": 0, "failed": 0}
    deadline = time.monotonic() + deadline_s
    for child in stage.children:
        if child.process.pid in stage.deaths:
            continue
        try:
            left = max(1.0, deadline - time.monotonic())
            report = await asyncio.to_thread(child.wait_for, "report", left)
        except AssertionError:
            watchdog = "jobrun watchdog" in child.stderr()
            stage.notes.append(
                f"{child.name} ended by jobrun's watchdog"
                if watchdog
                else f"{child.name} did not finish"
            )
            continue
        for name in totals:
            totals[name] += int(report.get(name, 0))
    return totals


async def _final_statuses(url: str) -> list[jobrun.JobRun]:
    engine = create_async_engine(url)
    try:
        return await jobrun.job_runs(jobrun.SqlJobRunStore(engine), module_id="chaos", limit=500)
    finally:
        await engine.dispose()


async def run_scenario(
    fault: Fault, backend: str, postgres_url: str, workdir: Path, *, drivers: int = 3
) -> Outcome:
    """Run one fault on one backend; never leaves anything behind."""
    os.makedirs(workdir, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        stage = Stage(backend, workdir, postgres_url, stack, log=workdir / "bodies.log")
        stage.passes = fault.passes
        try:
            await fault.before_database(stage)
            await _make_database(stage)
            await _start_runs(stage.url, fault.runs)
            await fault.before_drivers(stage)
            await asyncio.to_thread(_start_drivers, stage, fault, drivers)
            await fault.inject(stage)
            totals = await _wait_for_drivers(stage, fault.deadline_s + 10)
            rows = await _final_statuses(stage.url)
        except Exception as error:
            verdict = _judge(stage)
            return Outcome(fault.name, backend, verdict, error=f"{type(error).__name__}: {error}")
        outcome = Outcome(fault.name, backend, _judge(stage), runs=len(rows), notes=stage.notes)
        outcome.lost = sum(row.status != "done" for row in rows)
        outcome.failed = sum(row.status == "failed" for row in rows)
        outcome.notes.append(
            f"{totals['taken_over']} passes after a takeover, {totals['superseded']} superseded, "
            f"{totals['failed']} failed passes, {totals['store_errors']} store errors"
        )
        return outcome
    raise AssertionError("unreachable")  # the exit stack does not swallow exceptions


async def assert_a_clean_scenario(fault: Fault, backend: str, url: str, tmp: Path) -> None:
    """Run ``fault`` on ``backend`` and assert what every chaos test asserts: step bodies
    ran, no two of one run overlapped, no healthy run failed and none was lost."""
    outcome = await run_scenario(fault, backend, url, tmp)
    verdict = outcome.verdict
    print(f"\n{fault.name} / {backend}: {verdict}; {outcome.notes}")
    assert not outcome.error, outcome.error
    assert verdict.bodies > 0
    assert verdict.overlaps == 0, verdict.overlapping
    assert outcome.failed == 0, "a healthy run failed"
    assert outcome.lost == 0, f"{outcome.lost} of {outcome.runs} runs not done"
    if fault.resume_within_s is not None:
        assert verdict.resume_s is not None, "the affected run never resumed"
        assert verdict.resume_s < fault.resume_within_s, f"resumed {verdict.resume_s:.1f} s after"


def _judge(stage: Stage) -> Verdict:
    return judge(
        stage.log,
        pauses=stage.pauses,
        deaths=stage.deaths,
        now_ns=time.monotonic_ns(),
        resume_from_ns=stage.resume_from_ns,
        affected_runs=stage.affected_runs,
    )
