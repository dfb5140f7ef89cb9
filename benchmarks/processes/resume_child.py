"""A process of the compare_resume scenario: it drives one run of N steps (jobrun: one
pass; DBOS: one workflow with a fixed id) whose bodies wait ``--body-ms`` and append
``<pid> <index> <time>`` to ``--log``; killed half way, then run again to resume.

It prints ``{"ready_at": ...}`` once its imports are done (no database touched yet),
then ``{"done_at": ..., "status": ...}`` when the run ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.processes.dbos_app import dbos_config

RUN_INSTANCE = "resume"
WORKFLOW_ID = "bench-resume"


def log_body(log: Path, index: int) -> None:
    with log.open("a") as file:
        file.write(f"{os.getpid()} {index} {time.time():.6f}\n")


async def jobrun_child(args: Any) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    import jobrun

    ready_at = time.time()
    registry = jobrun.JobRegistry()

    async def body(index: int) -> int:
        await asyncio.sleep(args.body_ms / 1000)  # the simulated body's work
        log_body(args.log, index)
        return index

    @registry.job("bench", "resume")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(args.n):
            await p.step(f"s{index}", lambda index=index: body(index))
        return jobrun.PassResult(done=True)

    engine = create_async_engine(args.url)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(store, module_id="bench", job="resume", instance=RUN_INSTANCE)
    print(json.dumps({"ready_at": ready_at}), flush=True)
    while True:
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        found = await jobrun.get_job_run(store, run.id)
        assert found is not None
        if found.status != "running":
            break
        if report.attempted == 0:
            await asyncio.sleep(0.01)  # poll: the count is a file another process writes
    print(json.dumps({"done_at": time.time(), "status": found.status}), flush=True)
    await engine.dispose()


async def dbos_child(args: Any) -> None:
    from dbos import DBOS, SetWorkflowID

    ready_at = time.time()
    # DBOS types its config as a TypedDict.
    DBOS(config=dbos_config("jobrun-resume", args.url))  # type: ignore[arg-type]

    @DBOS.step()
    async def body(index: int) -> int:
        await asyncio.sleep(args.body_ms / 1000)  # the simulated body's work
        log_body(args.log, index)
        return index

    @DBOS.workflow()
    async def workflow(count: int) -> int:
        return sum([await body(index) for index in range(count)])

    print(json.dumps({"ready_at": ready_at}), flush=True)
    DBOS.launch()  # recovers this executor's pending workflows
    if args.first:
        with SetWorkflowID(WORKFLOW_ID):
            handle = await DBOS.start_workflow_async(workflow, args.n)
    else:
        handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
    result = await handle.get_result()
    print(json.dumps({"done_at": time.time(), "status": str(result)}), flush=True)
    DBOS.destroy()


async def child_main(args: Any) -> None:
    await (jobrun_child(args) if args.child == "jobrun" else dbos_child(args))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--child", choices=["jobrun", "dbos"], required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--body-ms", type=float, required=True)
    parser.add_argument("--first", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(child_main(parse()))
