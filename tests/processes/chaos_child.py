"""One driver process of the chaos runner (``tests/chaos``), not a test module.

It registers ``("chaos", "walk")`` with a short lease and calls
``run_due_jobs`` in a loop until no running run is left (or its deadline). A
store error escaping a call (the database went away) is reported as an
``error`` event and the loop goes on after a short pause, as a worker would.

Each pass ``n`` runs ``--steps`` steps named ``p<n>.s<k>``; each step body
sleeps a known time (``--body-ms`` to twice that, by step) and writes to the
referee's log, a file shared by every driver and opened with ``O_APPEND``:
``B <run> <step> <pid> <start_ns>`` when it starts and
``E <run> <step> <pid> <start_ns> <end_ns> <outcome>`` when it ends (``ok``,
or ``cancelled`` when the pass was stopped inside it), and
``A <run> <step> <pid> <start_ns> <ack_ns>`` when the step it ran was recorded
(``p.step`` returned: the step is acknowledged, durable). Times are
``time.monotonic_ns()``, one clock for every process on Linux. A killed body
leaves only its ``B`` line.

With ``--worker`` it drives through :func:`jobrun.run_worker` instead, as ``jobrun
worker`` does (library defaults: one driver, woken or idle between drives), and
stops it once a run exists and none is left running. ``JOBRUN_CHAOS_MACHINE=NAME`` in its
environment makes it claim and judge as if it ran on machine NAME (a boot id of
its own: ``/proc`` proves nothing across machines).

Events go to stdout as JSON lines (``tests.support.Child`` reads them):
``ready``, ``judging`` (its first lease reading), ``looked`` (each of its first
calls of ``run_due_jobs`` done), ``body`` (a body started: run, step, ns), ``error``, ``report``
(the drive reports' counters summed, store errors, and ``taken_over``: passes
that began on a run taken over from another holder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE, JOB = "chaos", "walk"
# The first calls of run_due_jobs a driver reports (``looked``), each once done.
LOOKS_REPORTED = 5
COUNTED = ("attempted", "advanced", "completed", "retrying", "failed", "superseded")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--log", required=True, help="the referee's log file")
    parser.add_argument("--lease-ms", type=int, default=3000)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="steps per pass")
    parser.add_argument("--body-ms", type=int, default=100)
    parser.add_argument("--max-passes", type=int, default=2, help="passes per claim")
    parser.add_argument("--poll-s", type=float, default=0.05)
    parser.add_argument("--deadline-s", type=float, default=90.0)
    parser.add_argument("--worker", action="store_true", help="drive with run_worker")
    return parser.parse_args(argv)


class CountTakeovers:
    """A pass observer that counts the passes that began with a takeover (and, for a
    worker, whose counts no report sums, every pass by its outcome)."""

    def __init__(self, totals: dict[str, Any], outcomes: bool = False) -> None:
        self.totals = totals
        self.outcomes = outcomes

    def pass_started(self, start: Any) -> CountTakeovers | None:
        self.totals["taken_over"] += int(start.taken_over)
        return self if self.outcomes else None

    def step_started(self, name: str) -> None:
        return None

    def step_ended(self, end: Any) -> None:
        return None

    def pass_ended(self, end: Any) -> None:
        self.totals["attempted"] += 1
        if end.outcome in COUNTED:
            self.totals[end.outcome] += 1


def make_registry(args: argparse.Namespace, log_fd: int) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    def write(line: str) -> None:
        os.write(log_fd, line.encode())  # one write: O_APPEND keeps lines whole

    # The start of the body each step of each run ran here, until the step is recorded.
    started: dict[tuple[str, str], int] = {}

    async def body(run_id: str, step: str, sleep_ms: int) -> str:
        start_ns = started[run_id, step] = time.monotonic_ns()
        write(f"B {run_id} {step} {os.getpid()} {start_ns}\n")
        emit("body", run=run_id, step=step, ns=start_ns)
        outcome = "cancelled"
        try:
            # sleep: the body's known duration (simulated work)
            await asyncio.sleep(sleep_ms / 1000)
            outcome = "ok"
        finally:
            end_ns = time.monotonic_ns()
            write(f"E {run_id} {step} {os.getpid()} {start_ns} {end_ns} {outcome}\n")
        return step

    @registry.job(MODULE, JOB, lease_ms=args.lease_ms)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        pass_no = (p.cursor or 0) + 1
        for index in range(1, args.steps + 1):
            step = f"p{pass_no}.s{index}"
            sleep_ms = args.body_ms * (1 + (pass_no + index) % 2)
            await p.step(step, lambda step=step, sleep_ms=sleep_ms: body(p.run.id, step, sleep_ms))
            start_ns = started.pop((p.run.id, step), None)
            if start_ns is not None:  # not replayed from the ledger: run and recorded here
                write(f"A {p.run.id} {step} {os.getpid()} {start_ns} {time.monotonic_ns()}\n")
        return jobrun.PassResult(cursor=pass_no, done=pass_no >= args.passes)

    return registry


async def drive(
    args: argparse.Namespace, store: Any, registry: jobrun.JobRegistry, totals: dict[str, Any]
) -> None:
    deadline = time.monotonic() + args.deadline_s
    while time.monotonic() < deadline:
        try:
            report = await jobrun.run_due_jobs(
                store,
                registry,
                max_passes=args.max_passes,
                limit=1,
                driver_name=args.name,
                observer=CountTakeovers(totals),
            )
            totals["calls"] += 1
            if totals["calls"] <= LOOKS_REPORTED:
                # A fault can wait for a driver's first claims to be done, not guess a time.
                emit("looked", calls=totals["calls"], attempted=report.attempted)
            for counted in COUNTED:
                totals[counted] += getattr(report, counted)
            if report.attempted:
                continue
            if not await jobrun.job_runs(store, status="running", limit=1):
                return
        except Exception as error:
            totals["store_errors"] += 1
            emit("error", error=f"{type(error).__name__}: {error}"[:300])
        # sleep: a poll interval between looks for due runs (or after a store error)
        await asyncio.sleep(args.poll_s)
    emit("deadline")


async def drive_as_worker(
    args: argparse.Namespace, store: Any, registry: jobrun.JobRegistry, totals: dict[str, Any]
) -> None:
    """``run_worker`` with the library's defaults, stopped once no run is left running."""
    stop = asyncio.Event()
    observer = CountTakeovers(totals, outcomes=True)
    worker = asyncio.create_task(
        jobrun.run_worker(
            [store], registry, stop=stop, observer=observer, driver_name=args.name,
            max_passes=args.max_passes, limit=1,
        )
    )  # fmt: skip
    deadline = time.monotonic() + args.deadline_s
    try:
        while not worker.done() and time.monotonic() < deadline:
            try:
                # Done once a run exists and none is running (the run may come later).
                if await jobrun.job_runs(store, limit=1) and not await jobrun.job_runs(
                    store, status="running", limit=1
                ):
                    break
            except Exception as error:
                totals["store_errors"] += 1
                emit("error", error=f"{type(error).__name__}: {error}"[:300])
            # sleep: a poll interval between looks for a run left to drive
            await asyncio.sleep(0.2)
        else:
            if not worker.done():
                emit("deadline")
    finally:
        stop.set()
        await worker


def claim_from_elsewhere(machine: str) -> None:
    """Claim and judge as if on another machine (see the module's docstring)."""
    from dataclasses import replace

    from jobrun._host import system as _system

    elsewhere = replace(_system.local_identity(), host=machine, boot=f"boot-of-{machine}")
    _system.local_identity = lambda: elsewhere  # type: ignore[assignment]


def announce_first_judgement() -> None:
    """Print ``judging`` when this process first reads its clock for a lease decision.

    A wall-clock step is detected against what the process saw before it (see
    ``jobrun._core.time.wall_steps``): a fault that steps running drivers waits for
    each driver's first reading, since a process that starts after a step has no
    earlier reading to compare with (a limit docs/design.md states)."""
    from jobrun._core.time import wall_steps

    instants = wall_steps.StepWatch.instants
    announced = False

    def announcing(watch: wall_steps.StepWatch, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        nonlocal announced
        seen = instants(watch, *args, **kwargs)
        if not announced:
            announced = True
            emit("judging")
        return seen

    # Patched in this child process only, to observe (never change) its readings.
    wall_steps.StepWatch.instants = announcing  # type: ignore[method-assign]


async def main(args: argparse.Namespace) -> None:
    announce_first_judgement()
    machine = os.environ.get("JOBRUN_CHAOS_MACHINE")
    if machine:
        claim_from_elsewhere(machine)
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    engine = create_async_engine(args.url)
    store = jobrun.SqlJobRunStore(engine)
    try:
        await jobrun.job_runs(store, limit=1)  # schema check and a first connection
        emit("ready", name=args.name)
        totals: dict[str, Any] = dict.fromkeys(COUNTED, 0)
        totals |= {"calls": 0, "store_errors": 0, "taken_over": 0}
        driver = drive_as_worker if args.worker else drive
        await driver(args, store, make_registry(args, log_fd), totals)
        emit("report", name=args.name, **totals)
    finally:
        os.close(log_fd)
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
