"""Steps per second with 1, 8 and 64 runs in flight in one process, against the driver floor.

jobrun: ``C`` runs, each driven by its own ``run_due_jobs`` task (``limit=1``), each
pass doing ``S`` new trivial steps; the engine's pool is sized ``C``. Floor: ``C``
tasks, each on its own asyncpg connection from the same engine's pool, doing
one-row autocommit upserts into a table shaped like the ledger. Interleaved, in
steps (or upserts) per second. SQLite has one writer per database, so only
``C = 1`` is measured there.

Each rate is the median of the interleaved samples with its interquartile range;
``floor / jobrun`` is the median [IQR] of per-round ratios (the two samples of a
round were taken side by side). ``--profile`` prints a cProfile summary of the
largest concurrency. The table also gives each side's CPU time per step in this
process (median over the samples).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from typing import Any

from bench_step import SCRATCH, UPSERT
from harness import (
    backends,
    driver_dsn,
    fresh_engine,
    interleave_samples,
    options,
    profiled,
    round_ratios,
    save,
    shown,
    spread,
    table,
)

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

    async def writer(driver: Any) -> None:
        values = ["r", "", "1", 1, None, "2026-01-01T00:00:00.000Z"]
        for _ in range(steps):
            values[1] = uuid.uuid4().hex
            if driver is None:
                await run(sql, values)
            else:
                await driver.execute(sql, *values)

    async def sample() -> float:
        async with contextlib.AsyncExitStack() as borrowed:
            drivers: list[Any] = [None] * concurrency
            if pool is not None:
                # Borrowed before the clock starts: jobrun hands the connections it
                # kept back to the pool only after a second unused, and the floor
                # must not time that wait.
                for index in range(concurrency):
                    connection = await borrowed.enter_async_context(pool.connect())
                    drivers[index] = (await connection.get_raw_connection()).driver_connection
            started = time.perf_counter()
            await asyncio.gather(*(writer(driver) for driver in drivers))
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
            cpu: dict[str, list[float]] = {"driver floor": [], "jobrun": []}
            variants = {
                "driver floor": with_cpu(floor, cpu["driver floor"], concurrency * steps),
                "jobrun": with_cpu(
                    jobrun_sample(store, concurrency, steps), cpu["jobrun"], concurrency * steps
                ),
            }
            samples = await interleave_samples(variants, args.rounds or (1 if args.quick else 9))
            found: dict[str, Any] = {name: statistics.median(got) for name, got in samples.items()}
            found["spread"] = {name: spread(got) for name, got in samples.items()}
            found["floor / jobrun"] = round_ratios(samples["driver floor"], samples["jobrun"])
            if args.profile and concurrency == (1 if backend == "sqlite" else 64):
                found["profile"] = await profiled(
                    f"{backend}, {concurrency} in flight", variants["jobrun"]
                )
            used = {name: round(statistics.median(spent)) for name, spent in cpu.items()}
            results[f"{backend}-{concurrency}"] = found | {"cpu_us_per_step": used}
            await close()
            spent = f"{used['driver floor']} / {used['jobrun']}"
            rows.append(
                [
                    backend,
                    concurrency,
                    shown(found["spread"]["driver floor"], 0),
                    shown(found["spread"]["jobrun"], 0),
                    shown(found["floor / jobrun"], 2, "x"),
                    spent,
                ]
            )
            await engine.dispose()
            await floor_engine.dispose()
    table(
        "steps per second in one process: median [interquartile range]",
        ["", "in flight", "driver floor", "jobrun", "floor / jobrun", "CPU µs/step floor / jobrun"],
        rows,
    )
    save(args, "throughput", results)


def with_cpu(sample: Any, spent: list[float], count: int) -> Any:
    """``sample``, also recording this process's CPU time per step (a loaded machine
    stretches wall time, not the CPU a step costs; a jobrun sample's starts count too)."""

    async def timed() -> float:
        started = time.process_time()
        rate: float = await sample()
        spent.append((time.process_time() - started) * 1e6 / count)
        return rate

    return timed


def _pool(backend: str, concurrency: int) -> dict[str, Any]:
    return {} if backend == "sqlite" else {"pool_size": concurrency, "max_overflow": 0}


if __name__ == "__main__":
    asyncio.run(scenario(options(__doc__ or "", steps=100)))
