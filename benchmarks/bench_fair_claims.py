"""How long a priority-0 run waits among sustained priority-10 load (fair claims).

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_fair_claims.py            # SQLite, 2 drivers, 10 s
    .venv/bin/python benchmarks/bench_fair_claims.py --seconds 5 --ahead 40

One SQLite file holds ``--ahead`` priority-10 runs, then one priority-0 run.
Two drivers (each its own store object, as two processes would be) call
``run_due_jobs`` in a loop on the real clock. Each priority-10 pass takes
``--work-ms`` and starts a new priority-10 run before it finishes, so
``--ahead`` of them are always due. The script prints how many seconds and how
many claims (passes, all drivers) went by before the priority-0 run ran, or
that it never ran within ``--seconds``. It uses the public API only, so it runs
unchanged on a checkout from before fair claims.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE, JOB = "bench", "fair"


async def measure(seconds: float, ahead: int, work_ms: float, drivers: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        engine = create_async_engine(f"sqlite+aiosqlite:///{Path(directory) / 'fair.db'}")
        await jobrun.upgrade(engine)
        stores = [jobrun.SqlJobRunStore(engine) for _ in range(drivers)]
        numbers = itertools.count()
        claims = 0
        low_ran = asyncio.Event()
        registry = jobrun.JobRegistry()

        @registry.job(MODULE, JOB)
        async def work(p: jobrun.JobPass) -> jobrun.PassResult:
            nonlocal claims
            claims += 1
            if p.run.instance == "low":
                low_ran.set()
                return jobrun.PassResult(done=True)
            await asyncio.sleep(work_ms / 1000)  # the simulated pass's work
            instance = f"high-{next(numbers)}"
            await jobrun.start_job_run(
                stores[0], module_id=MODULE, job=JOB, instance=instance, priority=10
            )
            return jobrun.PassResult(done=True)

        for _ in range(ahead):
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
        tasks = [asyncio.create_task(driver(number)) for number in range(drivers)]
        try:
            await asyncio.wait_for(low_ran.wait(), seconds)
            waited = time.monotonic() - began
            print(
                f"priority-0 run ran after {waited:.2f} s and {claims} claims ({drivers} drivers)"
            )
        except TimeoutError:
            print(f"priority-0 run never ran in {seconds:.0f} s; {claims} claims meanwhile")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--ahead", type=int, default=20)
    parser.add_argument("--work-ms", type=float, default=5)
    parser.add_argument("--drivers", type=int, default=2)
    arguments = parser.parse_args()
    asyncio.run(measure(arguments.seconds, arguments.ahead, arguments.work_ms, arguments.drivers))


if __name__ == "__main__":
    main()
