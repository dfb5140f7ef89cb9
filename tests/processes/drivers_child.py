"""One driver process for ``tests/processes/test_many_drivers.py`` (not a test module).

It builds its own engine and store, registers the job ``("fleet", "walk")`` and
calls ``run_due_jobs`` in a loop until no running run is left (or ``--once``
after its first call that drove anything). It talks to the parent test through
JSON lines on stdout, one per event:

* ``ready``: engine and store work; with ``--wait-for-go`` it then waits for a
  line on stdin before driving, so that all drivers start together;
* ``sleep``: a step body is about to sleep (``--sleep-*``), the moment the
  parent kills or pauses this process;
* ``takeover`` (with ``--observe``): a pass started on a run that was taken
  over, with the row as the claim left it;
* ``report``: the sum of every ``JobDriveReport`` this process produced.

Each pass ``n`` (its cursor is the number of the last committed pass) runs two
steps, ``effect`` and ``second``; each step body inserts one row
``(run_id, pass_no, step, driver)`` into the sink table ``effects``, which has
no unique key, so a step body that ran twice shows up twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import sys
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE, JOB = "fleet", "walk"
SINK = text(
    "INSERT INTO effects (run_id, pass_no, step, driver) VALUES (:run, :pass_no, :step, :driver)"
)
DRIVER: contextvars.ContextVar[str] = contextvars.ContextVar("driver")
COUNTED = ("attempted", "advanced", "completed", "retrying", "failed", "superseded")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True, help="driver name prefix")
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=5, help="a run is done after this pass")
    parser.add_argument("--max-passes", type=int, default=2, help="passes per claim")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=1, help="driver loops in this process")
    parser.add_argument("--poll-s", type=float, default=0.02)
    parser.add_argument("--sleep-s", type=float, default=0.0)
    parser.add_argument("--sleep-pass", type=int, default=0, help="0: every pass")
    parser.add_argument("--sleep-step", default="effect")
    parser.add_argument("--observe", action="store_true")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--wait-for-go", action="store_true", help="start on a line on stdin")
    parser.add_argument("--deadline-s", type=float, default=90.0)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    engine = create_async_engine(args.url)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()

    async def effect(run_id: str, pass_no: int, step: str, driver: str) -> dict[str, Any]:
        async with engine.begin() as connection:
            await connection.execute(
                SINK, {"run": run_id, "pass_no": pass_no, "step": step, "driver": driver}
            )
        if args.sleep_s and step == args.sleep_step and args.sleep_pass in (0, pass_no):
            emit("sleep", run=run_id, pass_no=pass_no, step=step, driver=driver)
            # sleep: a step that takes this long: the lease must outlast it
            await asyncio.sleep(args.sleep_s)
        return {"driver": driver, "pass": pass_no}

    @registry.job(MODULE, JOB, lease_ms=args.lease_ms)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        driver = DRIVER.get()
        pass_no = (p.cursor or 0) + 1
        if args.observe:
            row = await store.get(p.run.id)
            assert row is not None
            if row.lease_takeovers:
                emit(
                    "takeover",
                    run=row.id,
                    pass_no=pass_no,
                    driver=driver,
                    takeovers=row.lease_takeovers,
                    attempts=row.attempts,
                    last_error=row.last_error,
                    began_at=row.lease_began_at,
                )
        await p.step("effect", lambda: effect(p.run.id, pass_no, "effect", driver))
        await p.step("second", lambda: effect(p.run.id, pass_no, "second", driver))
        return jobrun.PassResult(cursor=pass_no, done=pass_no >= args.passes)

    totals: dict[str, Any] = dict.fromkeys(COUNTED, 0) | {"calls": 0, "errors": []}
    per_driver: dict[str, int] = {}
    deadline = time.monotonic() + args.deadline_s

    async def drive(name: str) -> None:
        DRIVER.set(name)
        while time.monotonic() < deadline:
            report = await jobrun.run_due_jobs(
                store, registry, max_passes=args.max_passes, limit=args.limit, driver_name=name
            )
            totals["calls"] += 1
            for counted in COUNTED:
                totals[counted] += getattr(report, counted)
            totals["errors"].extend(f"{e.run_id}: {e.error}" for e in report.errors[:5])
            per_driver[name] = per_driver.get(name, 0) + report.attempted
            if report.attempted:
                if args.once:
                    return
                continue
            if not await jobrun.job_runs(store, status="running", limit=1):
                return
            # sleep: a poll interval between looks for due runs
            await asyncio.sleep(args.poll_s)
        emit("deadline", driver=name)

    try:
        await jobrun.job_runs(store, limit=1)  # schema check and a first connection
        emit("ready", name=args.name)
        if args.wait_for_go:
            await asyncio.to_thread(sys.stdin.readline)
        started = time.monotonic()
        names = [f"{args.name}-{index}" for index in range(args.concurrency)]
        await asyncio.gather(*(drive(name) for name in names))
        emit(
            "report",
            name=args.name,
            seconds=time.monotonic() - started,
            per_driver=per_driver,
            **totals,
        )
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
