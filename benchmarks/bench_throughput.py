"""Steps per second with 1, 8 and 64 runs in flight in one process, against the driver floor.

jobrun: ``C`` runs, each driven by its own ``run_due_jobs`` task (``limit=1``), each
pass doing ``S`` new trivial steps; the engine's pool is sized ``C``. Floor: ``C``
tasks, each on its own asyncpg connection from the same engine's pool, doing
one-row autocommit upserts into a table shaped like the ledger. Interleaved, in
steps (or upserts) per second. SQLite has one writer per database, so only
``C = 1`` is measured there.

``--profile`` prints a cProfile summary of the largest concurrency.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench_step import SCRATCH, UPSERT
from harness import backends, driver_dsn, fresh_engine, interleave, options, profiled, save, table

import jobrun


def jobrun_sample(store: jobrun.SqlJobRunStore, concurrency: int, steps: int) -> Any:
    registry = jobrun.JobRegistry()

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(steps):
            await p.step(f"s{index}", lambda index=index: index)
        return jobrun.PassResult(done=True)

    registry.register("bench", "flight", handler)

    async def sample() -> float:
        for _ in range(concurrency):
            await jobrun.start_job_run(
                store, module_id="bench", job="flight", instance=uuid.uuid4().hex
            )
        started = time.perf_counter()
        reports = await asyncio.gather(
            *(jobrun.run_due_jobs(store, registry, limit=1) for _ in range(concurrency))
        )
        elapsed = time.perf_counter() - started
        assert sum(report.completed for report in reports) == concurrency, reports
        return concurrency * steps / elapsed

    return sample


async def floor_sample(backend: str, engine: Any, concurrency: int, steps: int) -> Any:
    if backend == "sqlite":
        import aiosqlite

        connection = await aiosqlite.connect(driver_dsn(engine), isolation_level=None)
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 30000"):
            await connection.execute(f"PRAGMA {pragma}")
        await connection.execute(SCRATCH)
        sql, run = UPSERT.format("?, ?, ?, ?, ?, ?"), connection.execute_fetchall
        pool = None
    else:
        # The floor borrows its connections from the same engine's pool (sized C),
        # so both sides hold the same number of server connections.
        pool = engine
        async with engine.connect() as connection:
            raw = await connection.get_raw_connection()
            await raw.driver_connection.execute(SCRATCH)
        sql = UPSERT.format("$1, $2, $3, $4, $5, $6")

    async def writer() -> None:
        values = ["r", "", "1", 1, None, "2026-01-01T00:00:00.000Z"]
        if pool is None:
            for _ in range(steps):
                values[1] = uuid.uuid4().hex
                await run(sql, values)
            return
        async with pool.connect() as connection:
            driver = (await connection.get_raw_connection()).driver_connection
            for _ in range(steps):
                values[1] = uuid.uuid4().hex
                await driver.execute(sql, *values)

    async def sample() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(concurrency)))
        return concurrency * steps / (time.perf_counter() - started)

    async def close() -> None:
        if pool is None:
            await connection.close()

    return sample, close


async def scenario(args: Any) -> None:
    steps = 10 if args.quick else args.steps
    results: dict[str, Any] = {}
    rows = []
    for backend in backends(args):
        for concurrency in [1] if backend == "sqlite" else [1, 8, 64]:
            engine = await fresh_engine(backend, args, **_pool(backend, concurrency))
            store = jobrun.SqlJobRunStore(engine)
            # SQLite: the floor writes its own file, so each side pays the WAL
            # checkpoints of its own commits (see bench_step.py).
            floor_engine = await fresh_engine(backend, args) if backend == "sqlite" else engine
            floor, close = await floor_sample(backend, floor_engine, concurrency, steps)
            variants = {"driver floor": floor, "jobrun": jobrun_sample(store, concurrency, steps)}
            medians = await interleave(variants, args.rounds or (1 if args.quick else 5))
            if args.profile and concurrency == (1 if backend == "sqlite" else 64):
                # The table holds timings; the profile rides along as text (hence the ignore).
                medians["profile"] = await profiled(  # type: ignore[assignment]
                    f"{backend}, {concurrency} in flight", variants["jobrun"]
                )
            results[f"{backend}-{concurrency}"] = medians
            await close()
            floor, ours = medians["driver floor"], medians["jobrun"]
            rows.append(
                [backend, concurrency, f"{floor:,.0f}", f"{ours:,.0f}", f"{floor / ours:.2f}x"]
            )
            await engine.dispose()
            await floor_engine.dispose()
    table(
        "steps per second in one process",
        ["", "in flight", "driver floor", "jobrun", "floor / jobrun"],
        rows,
    )
    save(args, "throughput", results)


def _pool(backend: str, concurrency: int) -> dict[str, Any]:
    return {} if backend == "sqlite" else {"pool_size": concurrency, "max_overflow": 0}


if __name__ == "__main__":
    asyncio.run(scenario(options(__doc__ or "", steps=100)))
