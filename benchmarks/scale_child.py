"""One driver process for ``benchmarks/bench_scale.py`` (not meant to be run by hand).

It builds its own engine and store, registers the job ``("scale", "walk")`` and
calls ``jobrun.run_due_jobs`` in a loop until no running run is left. It talks
to the parent through JSON lines on stdout and plain lines on stdin:

* prints ``ready`` once the engine works (schema checked, a connection open),
  then waits for ``go`` on stdin, so that all drivers start together;
* prints ``step`` (with ``--announce``) as a pass enters its waiting step, the
  moment the parent may SIGKILL it;
* prints ``done`` with the summed ``JobDriveReport`` counters and the CPU time
  this process spent between ``go`` and ``done`` (all threads: the event loop
  and aiosqlite's worker), then waits for ``exit`` on stdin before closing its
  connections, so that the parent can read its Postgres backend's CPU time.

A pass ``n`` (the cursor holds the last committed pass number) runs two steps:

* ``fetch``: in ``io`` mode ``await asyncio.sleep(--sleep-ms)``, a simulated
  external call (with ``--io-steps 2`` the second step waits too); in ``cpu``
  mode it returns at once;
* ``apply``: inserts one row ``(run_id, pass_no, driver)`` into ``effects``,
  which has no unique key, so a pass whose body ran twice shows up twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE, JOB = "scale", "walk"
COUNTED = ("attempted", "advanced", "completed", "retrying", "failed", "superseded")
SINK = text("INSERT INTO effects (run_id, pass_no, driver) VALUES (:run, :pass_no, :driver)")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}), flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--mode", choices=("io", "cpu"), default="io")
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--io-steps", type=int, choices=(1, 2), default=1)
    parser.add_argument("--passes", type=int, default=5, help="a run is done after this pass")
    parser.add_argument("--max-passes", type=int, default=1, help="passes per claim")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--lease-ms", type=int, default=None, help="default: jobrun's")
    parser.add_argument("--poll-s", type=float, default=0.01)
    parser.add_argument("--announce", action="store_true", help="print a line per waiting step")
    parser.add_argument("--deadline-s", type=float, default=1800.0)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    connect_args: dict[str, Any] = {}
    if args.url.startswith("postgresql"):
        # The parent finds this driver's server backend (for its CPU time) by this name.
        connect_args["server_settings"] = {"application_name": args.name}
    engine = create_async_engine(args.url, connect_args=connect_args)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()
    sleep_s = args.sleep_ms / 1000 if args.mode == "io" else 0.0

    async def fetch(run_id: str, pass_no: int) -> int:
        if sleep_s:
            if args.announce:
                emit("step", run=run_id, pass_no=pass_no)
            await asyncio.sleep(sleep_s)
        return pass_no

    async def apply(run_id: str, pass_no: int) -> int:
        async with engine.begin() as connection:
            await connection.execute(SINK, {"run": run_id, "pass_no": pass_no, "driver": args.name})
        if sleep_s and args.io_steps == 2:
            await asyncio.sleep(sleep_s)
        return pass_no

    options: dict[str, Any] = {} if args.lease_ms is None else {"lease_ms": args.lease_ms}

    @registry.job(MODULE, JOB, **options)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        pass_no = int(p.cursor or 0) + 1
        await p.step("fetch", lambda: fetch(p.run.id, pass_no))
        await p.step("apply", lambda: apply(p.run.id, pass_no))
        return jobrun.PassResult(cursor=pass_no, done=pass_no >= args.passes)

    totals: dict[str, Any] = dict.fromkeys(COUNTED, 0) | {"calls": 0, "idle_polls": 0}
    errors: list[str] = []
    try:
        await jobrun.job_runs(store, limit=1)  # the schema check and a first connection
        emit("ready", name=args.name)
        await asyncio.to_thread(sys.stdin.readline)
        started_wall, started_cpu = time.monotonic(), time.process_time()
        deadline = started_wall + args.deadline_s
        timed_out = False
        while True:
            if time.monotonic() > deadline:
                timed_out = True
                break
            report = await jobrun.run_due_jobs(
                store,
                registry,
                limit=args.limit,
                max_passes=args.max_passes,
                driver_name=args.name,
            )
            totals["calls"] += 1
            for counted in COUNTED:
                totals[counted] += getattr(report, counted)
            errors.extend(f"{e.run_id}: {e.error}" for e in report.errors[:5])
            if report.attempted:
                continue
            # Nothing claimable: finished, or every running run is leased by someone else.
            if not await jobrun.job_runs(store, status="running", limit=1):
                break
            totals["idle_polls"] += 1
            await asyncio.sleep(args.poll_s)
        emit(
            "done",
            name=args.name,
            wall_s=time.monotonic() - started_wall,
            cpu_s=time.process_time() - started_cpu,
            timed_out=timed_out,
            errors=errors[:20],
            **totals,
        )
        await asyncio.to_thread(sys.stdin.readline)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
