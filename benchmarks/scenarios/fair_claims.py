"""How long a priority-0 run waits among sustained priority-10 load (fair claims).

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks fair_claims            # SQLite, 2 drivers, 10 s
    .venv/bin/python -m benchmarks fair_claims --seconds 5 --ahead 40

One SQLite file holds ``--ahead`` priority-10 runs, then one priority-0 run.
Two drivers (each its own store object, as two processes would be) call
``run_due_jobs`` in a loop on the real clock. Each priority-10 pass takes
``--work-ms`` and starts a new priority-10 run before it finishes, so
``--ahead`` of them are always due. The script prints how many seconds and how
many claims (passes, all drivers) went by before the priority-0 run ran, or
that it never ran within ``--seconds`` (``--quick``: 2 s). It uses the public API
only, so it runs unchanged on a checkout from before fair claims
(``JOBRUN_BENCH_CODE=DIR``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import jobrun
from benchmarks import harness

MODULE, JOB = "bench", "fair"


def registry_of(
    stores: list[jobrun.SqlJobRunStore],
    work_ms: float,
    low_ran: asyncio.Event,
    numbers: itertools.count[int],
) -> tuple[jobrun.JobRegistry, dict[str, int]]:
    """Priority-10 passes that start another priority-10 run each; the claims counted."""
    counted = {"claims": 0}
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB)
    async def work(p: jobrun.JobPass) -> jobrun.PassResult:
        counted["claims"] += 1
        if p.run.instance == "low":
            low_ran.set()
            return jobrun.PassResult(done=True)
        await asyncio.sleep(work_ms / 1000)  # the simulated pass's work
        instance = f"high-{next(numbers)}"
        await jobrun.start_job_run(
            stores[0], module_id=MODULE, job=JOB, instance=instance, priority=10
        )
        return jobrun.PassResult(done=True)

    return registry, counted


async def measure(args: Any, seconds: float) -> dict[str, Any]:
    engine = await args.databases.engine("sqlite")
    stores = [jobrun.SqlJobRunStore(engine) for _ in range(args.drivers)]
    low_ran = asyncio.Event()
    numbers = itertools.count()
    registry, counted = registry_of(stores, args.work_ms, low_ran, numbers)
    for _ in range(args.ahead):
        await jobrun.start_job_run(
            stores[0], module_id=MODULE, job=JOB, instance=f"high-{next(numbers)}", priority=10
        )
    await jobrun.start_job_run(stores[0], module_id=MODULE, job=JOB, instance="low", priority=0)

    async def driver(number: int) -> None:
        while not low_ran.is_set():
            await jobrun.run_due_jobs(
                stores[number], registry, driver_name=f"driver-{number}", observer=None
            )

    began = time.monotonic()
    tasks = [asyncio.create_task(driver(number)) for number in range(args.drivers)]
    waited = None
    try:
        await asyncio.wait_for(low_ran.wait(), seconds)
        waited = time.monotonic() - began
        print(
            f"priority-0 run ran after {waited:.2f} s and {counted['claims']} claims "
            f"({args.drivers} drivers)"
        )
    except TimeoutError:
        print(f"priority-0 run never ran in {seconds:.0f} s; {counted['claims']} claims meanwhile")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await engine.dispose()
    return {"low_ran_after_s": waited, "claims": counted["claims"]}


async def scenario(args: Any) -> None:
    seconds = 2.0 if args.quick else args.seconds
    found = await measure(args, seconds)
    settings = {"seconds": seconds, "ahead": args.ahead, "work_ms": args.work_ms}
    harness.save(args, {**found, **settings, "drivers": args.drivers})


if __name__ == "__main__":
    harness.run(scenario, seconds=10.0, ahead=20, work_ms=5.0, drivers=2)
