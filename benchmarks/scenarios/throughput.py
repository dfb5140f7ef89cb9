"""Steps per second with 1, 8 and 64 passes in flight in one process, against the driver floor.

Per dialect and concurrency ``C``, interleaved in one process, in steps (or
statements) per second:

* driver floor: ``C`` tasks, each on its own driver connection (on Postgres from
  the same engine's pool, sized ``C``), each doing ``S`` one-row autocommit
  upserts into a table shaped like the ledger;
* driver floor + fence: the same, each task sending jobrun's exact step
  statement (the upsert fenced on a run it holds, one run per task) with the
  parameters the store builds;
* jobrun steps: ``C`` runs, each driven by its own ``run_due_jobs`` task
  (``limit=1``), each pass doing ``S`` new trivial steps; timed from the moment
  all ``C`` handlers are running until all have done their steps (claims and
  commits outside the timing, as in the step scenario);
* jobrun passes: the same, timed from the first claim to the last commit, so
  ``C`` claims at once, the commits and the runs' starts count too.

SQLite has one writer per database, so only ``C = 1`` is measured there. Each
rate is the median of the interleaved samples with its interquartile range; a
ratio is the median [IQR] of per-round ratios (the samples of one round were
taken side by side). The CPU time per step of this process is measured over
each variant's own timed window (median over the samples). ``--profile`` prints a
cProfile summary of jobrun's steps at the largest concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import jobrun
from benchmarks import harness
from benchmarks.harness.floors import SCRATCH, UPSERT, Raw, held_run, step_statement

Spent = list[float]


class Window:
    """A timed window: wall and this process's CPU time between ``open`` and ``close``."""

    def __init__(self) -> None:
        self.wall_started = self.cpu_started = 0.0
        self.wall_s = self.cpu_s = 0.0

    def open(self) -> None:
        self.wall_started, self.cpu_started = time.perf_counter(), time.process_time()

    def close(self) -> None:
        self.wall_s = time.perf_counter() - self.wall_started
        self.cpu_s = time.process_time() - self.cpu_started

    def rate(self, count: int, spent: Spent) -> float:
        spent.append(self.cpu_s * 1e6 / count)
        return count / self.wall_s


def jobrun_steps(
    store: jobrun.SqlJobRunStore, concurrency: int, steps: int, spent: Spent
) -> Callable[[], Awaitable[float]]:
    """Steps in flight: every handler waits until all ``C`` run, then the clock runs
    until all have done their ``S`` steps (each then waits, so no commit overlaps)."""
    registry = jobrun.JobRegistry()
    window = Window()
    state: dict[str, Any] = {}

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        state["arrived"] += 1
        if state["arrived"] == concurrency:
            window.open()
            state["go"].set()
        await state["go"].wait()
        for index in range(steps):
            await p.step(f"s{index}", lambda index=index: index)
        state["finished"] += 1
        if state["finished"] == concurrency:
            window.close()
            state["done"].set()
        await state["done"].wait()
        return jobrun.PassResult(done=True)

    registry.register("bench", "steps", handler)

    async def sample() -> float:
        state.update(arrived=0, finished=0, go=asyncio.Event(), done=asyncio.Event())
        await start_runs(store, "steps", concurrency)
        await drive(store, registry, concurrency)
        return window.rate(concurrency * steps, spent)

    return sample


def jobrun_passes(
    store: jobrun.SqlJobRunStore, concurrency: int, steps: int, spent: Spent
) -> Callable[[], Awaitable[float]]:
    """Whole passes: ``C`` drivers claim at once, step, commit; the starts count too."""
    registry = jobrun.JobRegistry()
    window = Window()
    registry.register("bench", "passes", harness.trivial_steps(steps))

    async def sample() -> float:
        window.open()
        await start_runs(store, "passes", concurrency)
        wall_started = time.perf_counter()
        await drive(store, registry, concurrency)
        window.close()
        # The wall clock from the first claim (the starts are not steps in flight).
        window.wall_s = time.perf_counter() - wall_started
        return window.rate(concurrency * steps, spent)

    return sample


async def start_runs(store: jobrun.SqlJobRunStore, job: str, concurrency: int) -> None:
    for _ in range(concurrency):
        await jobrun.start_job_run(store, module_id="bench", job=job, instance=uuid.uuid4().hex)


async def drive(store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, count: int) -> None:
    reports = await asyncio.gather(
        *(jobrun.run_due_jobs(store, registry, limit=1) for _ in range(count))
    )
    assert sum(report.completed for report in reports) == count, reports


async def floor_sample(
    backend: str, engine: Any, concurrency: int, steps: int, spent: Spent, fenced: bool
) -> tuple[Callable[[], Awaitable[float]], Callable[[], Awaitable[None]]]:
    """``C`` writers on driver connections: the plain upsert, or jobrun's fenced statement."""
    window = Window()
    if backend == "sqlite":
        raw = Raw(backend)
        await raw.open(engine)  # its pragmas and the scratch table
        connection = raw.connection
        plain = UPSERT.format("?, ?, ?, ?, ?, ?")
    else:
        async with engine.connect() as borrowed:
            raw = await borrowed.get_raw_connection()
            await raw.driver_connection.execute(SCRATCH)
        plain = UPSERT.format("$1, $2, $3, $4, $5, $6")
    # One held run per writer, as each jobrun pass holds its own.
    statements: list[tuple[str, list[Any], tuple[int, ...]]] = []
    for _ in range(concurrency):
        if fenced:
            statements.append(step_statement(engine, await held_run(engine)))
        else:
            statements.append((plain, ["r", "", "1", 1, None, "2026-01-01T00:00:00.000Z"], (1,)))

    async def writer(driver: Any, statement: tuple[str, list[Any], tuple[int, ...]]) -> None:
        sql, values, step_at = statement
        for _ in range(steps):
            name = uuid.uuid4().hex
            for at in step_at:  # twice on SQLite (see harness.floors.step_statement)
                values[at] = name
            if driver is None:
                await connection.execute_fetchall(sql, values)
            else:
                await driver.fetch(sql, *values)

    async def sample() -> float:
        async with contextlib.AsyncExitStack() as borrowed:
            drivers: list[Any] = [None] * concurrency
            if backend == "postgres":
                # The floor borrows its connections from the same engine's pool (sized
                # C), so both sides hold as many server connections; borrowed before the
                # clock starts: jobrun hands the connections it kept back to the pool
                # only after a second unused, and the floor must not time that wait.
                for index in range(concurrency):
                    pooled = await borrowed.enter_async_context(engine.connect())
                    drivers[index] = (await pooled.get_raw_connection()).driver_connection
            window.open()
            await asyncio.gather(*map(writer, drivers, statements))
            window.close()
            return window.rate(concurrency * steps, spent)

    async def close() -> None:
        if backend == "sqlite":
            await connection.close()

    return sample, close


async def measure(backend: str, concurrency: int, args: Any, steps: int) -> dict[str, Any]:
    engine = await args.databases.engine(backend, **_pool(backend, concurrency))
    store = jobrun.SqlJobRunStore(engine)
    # SQLite: each floor writes its own file, so each side pays the WAL checkpoints
    # of its own commits (see the step scenario).
    floor_engines = [engine, engine]
    if backend == "sqlite":
        floor_engines = [await args.databases.engine(backend) for _ in range(2)]
    cpu: dict[str, Spent] = {name: [] for name in NAMES}
    floor, close_floor = await floor_sample(
        backend, floor_engines[0], concurrency, steps, cpu[NAMES[0]], fenced=False
    )
    fence, close_fence = await floor_sample(
        backend, floor_engines[1], concurrency, steps, cpu[NAMES[1]], fenced=True
    )
    variants = {
        NAMES[0]: floor,
        NAMES[1]: fence,
        NAMES[2]: jobrun_steps(store, concurrency, steps, cpu[NAMES[2]]),
        NAMES[3]: jobrun_passes(store, concurrency, steps, cpu[NAMES[3]]),
    }
    samples = await harness.interleave_samples(variants, args.rounds or (1 if args.quick else 9))
    found: dict[str, Any] = {name: statistics.median(got) for name, got in samples.items()}
    found["spread"] = {name: harness.spread(got) for name, got in samples.items()}
    found["ratios"] = {
        f"{floor_name} / {ours}": harness.round_ratios(samples[floor_name], samples[ours])
        for floor_name, ours in RATIOS
    }
    found["cpu_us_per_step"] = {
        name: round(statistics.median(spent)) for name, spent in cpu.items()
    }
    if args.profile and concurrency == (1 if backend == "sqlite" else 64):
        runner = jobrun_steps(store, concurrency, steps, [])
        found["profile"] = await harness.profiled(f"{backend}, {concurrency} in flight", runner)
    await close_floor()
    await close_fence()
    await engine.dispose()
    for floor_engine in floor_engines:
        await floor_engine.dispose()
    return found


NAMES = ("driver floor", "driver floor + fence", "jobrun steps", "jobrun passes")
RATIOS = [(NAMES[0], NAMES[2]), (NAMES[1], NAMES[2]), (NAMES[0], NAMES[3])]


async def scenario(args: Any) -> None:
    steps = 10 if args.quick else args.steps
    results: dict[str, Any] = {}
    for backend in harness.backends(args):
        for concurrency in [1] if backend == "sqlite" else [1, 8, 64]:
            results[f"{backend}-{concurrency}"] = await measure(backend, concurrency, args, steps)
    rates, ratios = [], []
    for key, found in results.items():
        backend, concurrency = key.split("-")
        used = found["cpu_us_per_step"]
        rates.append(
            [backend, concurrency]
            + [harness.shown(found["spread"][name], 0) for name in NAMES]
            + [" / ".join(str(used[name]) for name in NAMES)]
        )
        ratios.append(
            [backend, concurrency]
            + [harness.shown(found["ratios"][f"{a} / {b}"], 2, "x") for a, b in RATIOS]
        )
    harness.table(
        "steps per second in one process: median [interquartile range]",
        ["", "in flight", *NAMES, "CPU µs/step, in that order"],
        rates,
    )
    harness.table(
        "ratios, median [IQR] of per-round ratios",
        ["", "in flight", *(f"{a} / {b}" for a, b in RATIOS)],
        ratios,
    )
    harness.save(args, results)


def _pool(backend: str, concurrency: int) -> dict[str, Any]:
    return {} if backend == "sqlite" else {"pool_size": concurrency, "max_overflow": 0}


if __name__ == "__main__":
    harness.run(scenario, steps=100)
