"""Wall-clock steps under real drivers (issue 31 item 3): libfaketime, monotonic left alone.

Every driver runs with libfaketime preloaded, its wall clock offset by the
contents of a file of its own (re-read at each reading, so the offset can change
under a running process) while its monotonic clock stays real, as an NTP step or
a resumed VM leaves it. The fault waits until every driver has read its clock
for a lease decision (a step is seen against an earlier reading: a process
started after the step has none, the limit docs/design.md states under "Clock
steps"), then for a body, then steps the wall clock of the whole host (every
driver; SQLite's drivers all live on one host), of one client that does not
hold the run, or of the holder itself.

A process started *after* a step has no earlier reading; on SQLite the lease's
expiry on the boot clock (revision 0010), which libfaketime leaves alone with
``DONT_FAKE_MONOTONIC`` (it fakes ``CLOCK_BOOTTIME`` only with the monotonic
clock), is what keeps it from a live lease: :class:`ClockStepThenStart`.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.chaos.stage import REPO, Fault, Stage, admin, start_driver

WORKER_CHILD = REPO / "tests" / "processes" / "chaos_worker.py"

# Debian's libfaketime (package ``libfaketime``; the ``faketime`` wrapper depends on it).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
WHOM = {"host": "the whole host", "client": "one client", "holder": "the holder"}


def faketime_missing() -> str | None:
    """Why a clock step cannot be staged here, or ``None``."""
    if not LIBFAKETIME.exists() or shutil.which("faketime") is None:
        return "libfaketime is not installed (Debian package faketime)"
    return None


class ClockStep(Fault):
    quick = True
    drivers = 3

    def __init__(self, whom: str, seconds: int, backends: tuple[str, ...]) -> None:
        self.whom, self.seconds, self.backends = whom, seconds, backends
        self.name = f"clock {seconds:+d} s, {WHOM[whom]}"
        # What tells this fault's test id from the others' of the same step.
        self.suffix = ""
        self._files: dict[int, Path] = {}

    async def before_drivers(self, stage: Stage) -> None:
        for index in range(self.drivers):
            offset = self._files[index] = stage.workdir / f"d{index}.faketime"
            offset.write_text("+0\n")
            stage.driver_env[index] = {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(offset),
                # Re-read the file at every reading: the step lands mid-run.
                "FAKETIME_NO_CACHE": "1",
                "DONT_FAKE_MONOTONIC": "1",
            }

    async def inject(self, stage: Stage) -> None:
        # Every driver is running when its clock steps: each has read its clock for a
        # lease decision before (one started after a step cannot tell; see the module).
        for child in stage.children:
            await asyncio.to_thread(child.wait_for, "judging", 60)
        victim, event = await stage.victim_body()
        holder = stage.children.index(victim)
        for index, offset in self._files.items():
            stepped = (
                self.whom == "host"
                or (self.whom == "holder" and index == holder)
                or (self.whom == "client" and index != holder)
            )
            if stepped:
                offset.write_text(f"{self.seconds:+d}\n")
        stage.resume_from_ns = time.monotonic_ns()
        stage.affected_runs = {event["run"]}
        stage.notes.append(f"stepped at d{holder}'s body of {event['step']}")


class ClockStepThenStart(ClockStep):
    """The whole host +90 s on SQLite while the holder is stopped (SIGSTOP) mid-body, so
    its lease stays as written before the step; then a fourth driver starts, its
    clock stepped from birth: the lease's wall expiry looks 87 s past to it, and only
    the boot clock says the lease is live. It must not take the run; the holder,
    continued, finishes it. ``kill``: the holder is killed -9 instead, and the run
    goes on (its death proven by pid, or its lease expired on the boot clock)."""

    # Long enough that the late driver is claiming well within the held lease.
    lease_ms = 20_000

    def __init__(self, kill: bool) -> None:
        super().__init__("host", 90, ("sqlite",))
        self.kill = kill
        self.name += ", a driver started after it" + (", holder killed -9" if kill else "")
        self.suffix = "-started-after" + ("-kill" if kill else "")

    async def before_drivers(self, stage: Stage) -> None:
        await super().before_drivers(stage)
        late = self.drivers
        offset = self._files[late] = stage.workdir / f"d{late}.faketime"
        offset.write_text(f"{self.seconds:+d}\n")  # stepped before the process starts
        stage.driver_env[late] = dict(stage.driver_env[0], FAKETIME_TIMESTAMP_FILE=str(offset))

    async def inject(self, stage: Stage) -> None:
        for child in stage.children:
            await asyncio.to_thread(child.wait_for, "judging", 60)
        victim, event = await stage.victim_body()
        pid, stop_ns = victim.process.pid, time.monotonic_ns()
        victim.process.send_signal(signal.SIGKILL if self.kill else signal.SIGSTOP)
        if self.kill:
            stage.deaths[pid] = stop_ns
        for offset in self._files.values():
            offset.write_text(f"{self.seconds:+d}\n")
        stage.resume_from_ns, stage.affected_runs = stop_ns, {event["run"]}
        epoch = await _lease_epoch(stage.url, event["run"])
        try:
            late = await asyncio.to_thread(start_driver, stage, self, self.drivers)
            # Its first three claims done (each would have taken the lease if it could).
            await asyncio.to_thread(late.wait_for, "looked", 60, lambda event: event["calls"] >= 3)
            taken = await _lease_epoch(stage.url, event["run"]) != epoch
        finally:
            if not self.kill:
                victim.process.send_signal(signal.SIGCONT)
                stage.pauses[pid] = [(stop_ns, time.monotonic_ns())]
        if not self.kill and taken:
            raise AssertionError("a driver started after the step took the stopped holder's lease")
        stage.notes.append(
            f"d{self.drivers} started after the step; the lease was not taken"
            if not self.kill
            else f"d{self.drivers} started after the step"
        )


async def _lease_epoch(url: str, run_id: str) -> int:
    """The run's fencing epoch: one more for each claim of it."""
    quoted = run_id.replace("'", "''")
    (epoch,) = await admin(url, f"SELECT lease_epoch FROM _substrat_job_runs WHERE id = '{quoted}'")
    return int(epoch)


class ClockStepUnderWorker(ClockStep):
    """The same step, the drivers being real ``jobrun worker`` processes
    (``tests/processes/chaos_worker.py``); once every run is done, they are stopped
    with SIGTERM (a worker never stops by itself)."""

    driver_script = WORKER_CHILD

    def __init__(self, whom: str, seconds: int, backends: tuple[str, ...]) -> None:
        super().__init__(whom, seconds, backends)
        self.name += " (jobrun worker)"
        self.suffix = "-worker"

    async def inject(self, stage: Stage) -> None:
        await super().inject(stage)
        stage.notes.append("the drivers are jobrun worker processes: they report no pass counts")
        await until_no_run_is_running(stage.url, deadline_s=self.deadline_s)
        for child in stage.children:
            child.process.send_signal(signal.SIGTERM)
        for child in stage.children:
            await asyncio.to_thread(child.process.wait, 60)
            # Noted here, so that the end of the scenario waits for no report from it.
            stage.deaths.setdefault(child.process.pid, time.monotonic_ns())


async def until_no_run_is_running(url: str, deadline_s: float) -> None:
    engine = create_async_engine(url)
    store = jobrun.SqlJobRunStore(engine)
    try:
        deadline = time.monotonic() + deadline_s
        while await jobrun.job_runs(store, status="running", limit=1):
            if time.monotonic() > deadline:
                raise AssertionError(f"runs still running after {deadline_s:.0f} s")
            # sleep: a poll for the runs to finish
            await asyncio.sleep(0.1)
    finally:
        await engine.dispose()


def clock_steps() -> list[ClockStep]:
    return [
        ClockStep("host", 90, ("sqlite",)),
        ClockStep("host", -90, ("sqlite",)),
        ClockStep("client", 90, ("postgres",)),
        ClockStep("holder", -90, ("postgres",)),
        ClockStepUnderWorker("host", 90, ("sqlite",)),
        ClockStepUnderWorker("client", 90, ("postgres",)),
        ClockStepThenStart(kill=False),
        ClockStepThenStart(kill=True),
    ]
