"""Starts per second: ``start_job_runs`` in batches, and ``start_job_run`` from concurrent callers.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_starts.py                 # SQLite and Postgres
    .venv/bin/python benchmarks/bench_starts.py --sqlite-only --quick

Each database is new (a temp SQLite file; a Postgres database of a unique name,
dropped at the end). Every start is of a new key (no joins), payload
``{"n": i}``. Variants, each sampled ``--rounds`` times, interleaved:

* ``batch``: ``--batches`` calls of ``start_job_runs`` with ``--batch-size`` starts
  each, one after another (skipped on a checkout without ``start_job_runs``);
* ``single``: ``--singles`` calls of ``start_job_run`` spread over ``--callers``
  concurrent callers on one store (the issue's "8 concurrent callers").

The figure is starts per second (median of the rounds, with the spread); the
machine's load average is printed with it. Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import driver_dsn, interleave_samples, machine, main, options, save, spread, table
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun

MODULE, JOB = "bench", "starts"


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    admin_url = make_url(url).set(database="postgres")
    admin = await asyncpg.connect(driver_dsn(create_async_engine(admin_url)))
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


async def _engine(backend: str, args: Any) -> tuple[AsyncEngine, str | None]:
    """A migrated database of its own: (engine, the Postgres database to drop)."""
    if backend == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="jobrun-bench-starts-")) / "starts.db"
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        name = None
    else:
        name = f"jobrun_bench_starts_{os.getpid()}_{secrets.token_hex(3)}"
        await _admin(args.postgres_url, f'CREATE DATABASE "{name}"')
        engine = create_async_engine(
            make_url(args.postgres_url).set(database=name), pool_size=args.callers, max_overflow=0
        )
    await jobrun.upgrade(engine)
    return engine, name


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
    for backend in ["sqlite"] if args.sqlite_only else ["sqlite", "postgres"]:
        engine, name = await _engine(backend, args)
        try:
            store = jobrun.SqlJobRunStore(engine)
            await store.get("0" * 26)  # the schema check, outside the samples
            samples = await interleave_samples(_variants(store, args), rounds)
        finally:
            await engine.dispose()
            if name is not None:
                await _admin(args.postgres_url, f'DROP DATABASE "{name}" WITH (FORCE)')
        for variant, values in samples.items():
            found = spread(values)
            results[f"{backend}/{variant}"] = found
            rows.append(
                [
                    backend,
                    variant,
                    f"{found['median']:.0f}",
                    f"{found['min']:.0f}-{found['max']:.0f}",
                ]
            )
    load = machine()["load_1min"]
    table(f"starts/s (load {load})", ["database", "variant", "median", "spread"], rows)
    save(args, "starts", results)


if __name__ == "__main__":
    main(
        scenario,
        options(
            "starts per second, batched and concurrent",
            batches=10,
            batch_size=1000,
            singles=2000,
            callers=8,
        ),
    )
