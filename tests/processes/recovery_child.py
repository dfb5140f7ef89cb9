"""One driver process for ``tests/processes/test_recovery.py`` (not a test module).

It registers ``("recover", "walk")`` with the library's default lease and calls
``run_due_jobs`` in a loop. Each pass ``n`` runs the steps ``one`` and ``two``;
the step named by ``--hang-step`` of the first pass sleeps for an hour (the
moment the parent kills or stops this process). Events go to stdout as JSON
lines: ``ready``, ``body`` (a step body starts), ``report`` (at the end).

``--foreign-host`` makes this process claim as if it ran on another machine (a
boot id of its own), so that it cannot prove anything through ``/proc`` and
must rely on what the database knows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._host import system as _system

MODULE, JOB = "recover", "walk"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}), flush=True)


async def main(args: argparse.Namespace) -> None:
    if args.foreign_host:
        elsewhere = replace(_system.local_identity(), host="elsewhere", boot="another-machine")
        # Both the claim (who we are) and the proof (who is here) see the other machine.
        _system.local_identity = lambda: elsewhere  # type: ignore[assignment]
    engine = create_async_engine(args.url)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        pass_no = (p.cursor or 0) + 1

        async def body(step: str) -> int:
            emit("body", run=p.run.id, pass_no=pass_no, step=step, name=args.name)
            if pass_no == 1 and step == args.hang_step:
                # sleep: a hung step body: only a kill or a cancel ends it
                await asyncio.sleep(3600)
            return pass_no

        await p.step("one", lambda: body("one"))
        await p.step("two", lambda: body("two"))
        return jobrun.PassResult(cursor=pass_no, done=pass_no >= args.passes)

    totals = {"attempted": 0, "advanced": 0, "completed": 0, "superseded": 0}
    try:
        await jobrun.job_runs(store, limit=1)  # schema check and a first connection
        emit("ready", name=args.name)
        deadline = time.monotonic() + args.deadline_s
        while time.monotonic() < deadline:
            report = await jobrun.run_due_jobs(store, registry, driver_name=args.name)
            for name in totals:
                totals[name] += getattr(report, name)
            if not report.attempted:
                if args.until_done and not await jobrun.job_runs(store, status="running"):
                    break
                # sleep: a poll interval between looks for due runs
                await asyncio.sleep(0.02)
        emit("report", name=args.name, **totals)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--hang-step", default="")
    parser.add_argument("--foreign-host", action="store_true")
    parser.add_argument("--until-done", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=90.0)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
