"""Several drivers with leases against one store, interleaved by hypothesis.

Each driver is a ``run_due_jobs(limit=1)`` call in its own task whose handler
pauses at checkpoints: when its pass begins and after each step. A rule lets one
driver go on to its next checkpoint (or to the end of its call) while every
other driver stays paused, so an interleaving is exactly the sequence of rules
and a failing case replays. Between them the rules start runs, move the fake
clock past lease expiries (so another driver takes a held run over), renew a
lease as the background renewer would, and cancel, resume, release and prune.

The lease is ten minutes, so the real background renewer (every quarter lease
of real time) never fires during a case; the ``renew`` rule sends the same
fenced write at a moment hypothesis chooses.

Checked after every rule:

* at most one live run per key;
* the lease holder never calls a step body whose result is in the ledger; a
  driver whose lease is gone calls at most one body (it cannot know before its
  write is refused), then stops;
* every ledger row belongs to the run's current pass (step names carry the
  cursor the pass started from);
* a driver whose lease is gone (expired and taken, released, cancelled, pruned)
  changes nothing, whatever it goes on to do;
* each run's counters and cursor equal the passes the drivers reported
  committed for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun.sql.schema import job_runs, job_steps
from jobrun.testing import FakeClock, MemoryJobRunStore

MODULE, JOB = "model", "fleet"
INSTANCES = ["a", "b", "c"]
DRIVERS = 3
LEASE_MS = 600_000
POLICY = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=1000, max_delay_ms=3000)
ENDINGS = ["advance", "done", "raise"]
# An operator action on a run that is not in the state it needs, or was pruned.
REFUSALS = (jobrun.JobConflictError, jobrun.JobRunNotFoundError)


@dataclass(frozen=True)
class Plan:
    """What one pass does: its steps (each succeeds or raises) and how it ends."""

    steps: tuple[bool, ...]
    ending: str


plans = st.builds(
    Plan,
    steps=st.lists(st.sampled_from([True, True, True, False]), max_size=3).map(tuple),
    ending=st.sampled_from(ENDINGS),
)


@dataclass
class Driver:
    name: str
    task: asyncio.Task[jobrun.JobDriveReport] | None = None
    run_id: str | None = None
    token: str | None = None
    plan: Plan = field(default_factory=lambda: Plan((), "advance"))
    bodies_unheld: int = 0
    paused: asyncio.Event = field(default_factory=asyncio.Event)
    go: asyncio.Event = field(default_factory=asyncio.Event)

    async def checkpoint(self) -> None:
        self.go.clear()
        self.paused.set()
        await self.go.wait()


def cursor_of(row: Any) -> int:
    return 0 if row.cursor is None else int(json.loads(row.cursor))


class DriversMachine(RuleBasedStateMachine):
    backend = "memory"
    url: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.engine: Any = None
        if self.backend == "memory":
            self.store: Any = MemoryJobRunStore()
        else:
            assert self.url is not None
            self.engine = create_async_engine(self.url)
            self.store = jobrun.SqlJobRunStore(self.engine)
            self.run(self._empty_tables())
        self.drivers = [Driver(f"driver-{number}") for number in range(DRIVERS)]
        self.committed: dict[str, int] = {}
        self.started: list[str] = []
        self.problems: list[str] = []

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    async def _empty_tables(self) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(delete(job_steps))
            await connection.execute(delete(job_runs))

    def registry_for(self, driver: Driver) -> jobrun.JobRegistry:
        registry = jobrun.JobRegistry()

        async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
            row = await self.store.get(p.run.id)
            assert row is not None
            driver.run_id, driver.token = p.run.id, row.lease_owner
            driver.bodies_unheld = 0
            cursor = p.cursor or 0
            if any(step.result is not None for step in (await self.store.steps(p.run.id)).values()):
                event("a pass began with committed steps to replay")
            await driver.checkpoint()
            for index, succeeds in enumerate(driver.plan.steps):
                name = f"c{cursor}-s{index}"

                async def body(name: str = name, succeeds: bool = succeeds) -> str:
                    if not await self._holds(driver):
                        # A driver cannot know its lease is gone before a write is
                        # refused: it may run one body, then it must stop.
                        driver.bodies_unheld += 1
                        if driver.bodies_unheld > 1:
                            self.problems.append(f"{driver.name} went on after a refused write")
                    else:
                        # The holder runs a body only if no result of it is committed.
                        ledger = await self.store.steps(p.run.id)
                        if name in ledger and ledger[name].result is not None:
                            self.problems.append(f"step {name} of {p.run.id} ran again")
                    if not succeeds:
                        raise RuntimeError(f"boom {name}")
                    return name

                await p.step(name, body)
                await driver.checkpoint()
            if driver.plan.ending == "raise":
                raise RuntimeError("handler broke")
            p.count("passes")
            return jobrun.PassResult(cursor=cursor + 1, done=driver.plan.ending == "done")

        registry.register(MODULE, JOB, handler, retry=POLICY, lease_ms=LEASE_MS)
        return registry

    async def _progress(self, driver: Driver) -> None:
        """Let ``driver`` run to its next checkpoint or the end of its call."""
        assert driver.task is not None
        driver.paused.clear()
        driver.go.set()
        paused = asyncio.ensure_future(driver.paused.wait())
        try:
            await asyncio.wait({paused, driver.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            paused.cancel()
        if driver.task.done():
            report = driver.task.result()
            if driver.run_id is not None and report.advanced + report.completed:
                self.committed[driver.run_id] = self.committed.get(driver.run_id, 0) + 1
            driver.task, driver.run_id, driver.token = None, None, None

    async def _holds(self, driver: Driver) -> bool:
        if driver.run_id is None:
            return True
        row = await self.store.get(driver.run_id)
        return row is not None and row.status == "running" and row.lease_owner == driver.token

    async def _state(self, run_id: str) -> Any:
        return await self.store.get(run_id), await self.store.steps(run_id)

    # --- rules ---------------------------------------------------------------------------

    @initialize(instance=st.sampled_from(INSTANCES))
    def first_start(self, instance: str) -> None:
        self.start(instance)

    @rule(instance=st.sampled_from(INSTANCES))
    def start(self, instance: str) -> None:
        record = self.run(
            jobrun.start_job_run(
                self.store, module_id=MODULE, job=JOB, instance=instance, clock=self.clock
            )
        )
        if record.id not in self.started:
            self.started.append(record.id)

    def idle(self) -> list[Driver]:
        return [driver for driver in self.drivers if driver.task is None]

    def busy(self) -> list[Driver]:
        return [driver for driver in self.drivers if driver.task is not None]

    @precondition(lambda self: bool(self.idle()))
    @rule(data=st.data(), plan=plans, checkpoints=st.integers(0, 4))
    def begin(self, data: st.DataObject, plan: Plan, checkpoints: int) -> None:
        """An idle driver calls ``run_due_jobs``: it claims a due run, or finds none."""
        driver = data.draw(st.sampled_from(self.idle()))
        driver.plan = plan
        driver.task = self.loop.create_task(
            jobrun.run_due_jobs(
                self.store,
                self.registry_for(driver),
                limit=1,
                clock=self.clock,
                random=lambda: 0.5,
                driver_name=driver.name,
            )
        )
        self.run(self._progress(driver))
        event("a pass began" if driver.run_id is not None else "a driver found nothing due")
        for _ in range(checkpoints):
            if driver.task is None:
                return
            self.run(self._go_on(driver))

    @precondition(lambda self: bool(self.busy()))
    @rule(data=st.data(), checkpoints=st.integers(0, 6), renew_first=st.booleans())
    def go_on(self, data: st.DataObject, checkpoints: int, renew_first: bool) -> None:
        """A busy driver goes on by a few steps, or to the end of its pass.

        With ``renew_first`` its lease is renewed first: the renewer's fenced write,
        sent at a moment hypothesis chooses.
        """
        driver = data.draw(st.sampled_from(self.busy()))
        if renew_first and driver.run_id is not None:
            expires_at = add_milliseconds(format_instant(self.clock()), LEASE_MS)
            self.run(self._renew(driver, expires_at))
        for _ in range(checkpoints):
            if driver.task is None:
                return
            self.run(self._go_on(driver))

    async def _go_on(self, driver: Driver) -> None:
        if await self._holds(driver):
            await self._progress(driver)
            return
        # Superseded: whatever it does now must leave the run as it is.
        event("a driver went on after losing its lease")
        run_id = driver.run_id
        assert run_id is not None
        before = await self._state(run_id)
        await self._progress(driver)
        if await self._state(run_id) != before:
            self.problems.append(f"{driver.name} changed run {run_id} after losing its lease")

    async def _renew(self, driver: Driver, expires_at: str) -> None:
        assert driver.run_id is not None
        assert driver.token is not None
        held = await self._holds(driver)
        before = await self._state(driver.run_id)
        now_at = format_instant(self.clock())
        row = before[0]
        # An expired lease is never renewed back to life.
        unexpired = row is not None and (row.next_attempt_at or row.started_at) > now_at
        extended = await self.store.extend_lease(driver.run_id, driver.token, expires_at, now_at)
        if extended != (held and unexpired):
            self.problems.append(
                f"renewal by {driver.name} answered {extended}, held {held}, unexpired {unexpired}"
            )
        if not (held and unexpired) and await self._state(driver.run_id) != before:
            self.problems.append(f"a refused renewal by {driver.name} changed the run")

    @rule(milliseconds=st.sampled_from([1000, 3000, LEASE_MS + 1]))
    def advance(self, milliseconds: int) -> None:
        self.clock.advance(milliseconds=milliseconds)

    @rule(data=st.data(), action=st.sampled_from(["cancel", "resume", "release", "prune"]))
    def operator(self, data: st.DataObject, action: str) -> None:
        """An operator cancels, resumes or releases a run, or prunes ended runs."""
        if action == "prune":
            self.run(
                jobrun.prune_job_runs(
                    self.store,
                    older_than=timedelta(0),
                    statuses=("done", "failed"),
                    clock=self.clock,
                )
            )
            self.clock.advance(milliseconds=1)
            return
        run_id = data.draw(st.sampled_from(self.started))
        with contextlib.suppress(*REFUSALS):
            if action == "cancel":
                self.run(jobrun.cancel_job_run(self.store, run_id, "by hand", clock=self.clock))
            elif action == "resume":
                self.run(jobrun.resume_job_run(self.store, run_id, clock=self.clock))
            else:
                self.run(jobrun.release_job_lease(self.store, run_id))

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def nothing_went_wrong(self) -> None:
        assert self.problems == []

    @invariant()
    def store_is_consistent(self) -> None:
        self.run(self._check())

    async def _check(self) -> None:
        live: dict[str, str] = {}
        for run_id in self.started:
            row = await self.store.get(run_id)
            if row is None:
                continue
            if row.status == "running":
                assert row.instance not in live, f"two live runs of {row.instance}"
                live[row.instance] = run_id
            cursor = cursor_of(row)
            for name in await self.store.steps(run_id):
                assert name.startswith(f"c{cursor}-"), f"{run_id}: {name} is of another pass"
            passes = json.loads(row.counters).get("passes", 0)
            committed = self.committed.get(run_id, 0)
            assert (passes, cursor) == (committed, committed), (
                f"{run_id}: counters {passes}, cursor {cursor}, {committed} passes committed"
            )

    def teardown(self) -> None:
        try:
            for driver in self.drivers:
                if driver.task is not None:
                    driver.task.cancel()
                    self.run(asyncio.wait({driver.task}))
            if self.engine is not None:
                self.run(self.engine.dispose())
        finally:
            self.loop.close()


def _run_machine(backend: str, url: str | None, examples: int) -> None:
    machine = type(f"DriversMachine_{backend}", (DriversMachine,), {"backend": backend, "url": url})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("memory", id="memory"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def test_drivers_follow_the_lease_rules(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "memory":
        _run_machine("memory", None, 150)
        return
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="jobrun-drivers-")
        try:
            path = Path(directory) / "drivers.db"
            shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
            _run_machine("sqlite", f"sqlite+aiosqlite:///{path}", 30)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    _run_machine("postgres", request.getfixturevalue("database_url"), 15)
