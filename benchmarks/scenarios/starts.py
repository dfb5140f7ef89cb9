"""Starts per second: ``start_job_runs`` in batches, and ``start_job_run`` from concurrent callers.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks starts                 # SQLite and Postgres
    .venv/bin/python -m benchmarks starts --sqlite-only --quick

Each database is new (a temp SQLite file; a Postgres database of a unique name,
dropped at the end). Every start is of a new key (no joins), payload
``{"n": i}``. Variants, each sampled ``--rounds`` times, interleaved:

* ``batch``: ``--batches`` calls of ``start_job_runs`` with ``--batch-size`` starts
  each, one after another (skipped on a checkout without ``start_job_runs``);
* ``single``: ``--singles`` calls of ``start_job_run`` spread over ``--callers``
  concurrent callers on one store (the issue's "8 concurrent callers").

The figure is starts per second (median of the rounds, with the spread); the
machine's load average is printed with it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import jobrun
from benchmarks import harness

MODULE, JOB = "bench", "starts"


def _variants(store: Any, args: Any) -> dict[str, Any]:
    numbers = itertools.count()

    async def batch() -> float:
        began = time.perf_counter()
        for _ in range(args.batches):
            starts = [
                jobrun.JobStart(module_id=MODULE, job=JOB, instance=f"i{n}", payload={"n": n})
                for n in itertools.islice(numbers, args.batch_size)
            ]
            await jobrun.start_job_runs(store, starts)
        return args.batches * args.batch_size / (time.perf_counter() - began)

    async def single() -> float:
        async def caller(count: int) -> None:
            for _ in range(count):
                n = next(numbers)
                await jobrun.start_job_run(
                    store, module_id=MODULE, job=JOB, instance=f"i{n}", payload={"n": n}
                )

        each = args.singles // args.callers
        began = time.perf_counter()
        await asyncio.gather(*(caller(each) for _ in range(args.callers)))
        return each * args.callers / (time.perf_counter() - began)

    variants = {"single": single}
    if hasattr(jobrun, "start_job_runs"):
        variants["batch"] = batch
    return variants


async def scenario(args: Any) -> None:
    if args.quick:
        args.batches, args.batch_size, args.singles = 2, 500, 200
    rounds = args.rounds or (2 if args.quick else 5)
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    for backend in harness.backends(args):
        pool = {} if backend == "sqlite" else {"pool_size": args.callers, "max_overflow": 0}
        engine = await args.databases.engine(backend, **pool)
        store = jobrun.SqlJobRunStore(engine)
        await store.get("0" * 26)  # the schema check, outside the samples
        samples = await harness.interleave_samples(_variants(store, args), rounds)
        await engine.dispose()
        for variant, values in samples.items():
            found = harness.spread(values)
            results[f"{backend}/{variant}"] = found
            rows.append(
                [
                    backend,
                    variant,
                    f"{found['median']:.0f}",
                    f"{found['min']:.0f}-{found['max']:.0f}",
                ]
            )
    harness.table(
        f"starts/s (load {harness.load()[0]})", ["database", "variant", "median", "spread"], rows
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, batches=10, batch_size=1000, singles=2000, callers=8)
