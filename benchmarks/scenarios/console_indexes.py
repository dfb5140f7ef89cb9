"""What the console's two indexes cost a start and a finish.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks console_indexes                # SQLite + Postgres
    .venv/bin/python -m benchmarks console_indexes --quick --sqlite-only

Two databases per backend, both at head and holding the same ``--history`` of
finished runs (filled as the console scenario does); in one, the console's indexes
(``_substrat_job_runs_job_status``, ``_substrat_job_runs_status``) are dropped.
Each round starts ``--batch`` runs in each database (timed one by one), then
finishes them with ``run_due_jobs`` (a handler done in one pass; timed per run),
the two databases taking turns first, so noise spreads over both alike.
Medians in microseconds, and the ratio with the indexes to without.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from benchmarks import harness
from benchmarks.scenarios._console_history import fill

CONSOLE_INDEXES = ("_substrat_job_runs_job_status", "_substrat_job_runs_status")
VARIANTS = ("with", "without")


async def _database(
    databases: harness.Databases, backend: str, variant: str, history: int
) -> AsyncEngine:
    engine = databases.engine_for(await databases.url(backend))
    await fill(engine, history, postgres=backend == "postgres")
    if variant == "without":
        async with engine.begin() as connection:
            for index in CONSOLE_INDEXES:
                await connection.execute(text(f"DROP INDEX {index}"))
    return engine


async def _round(store: jobrun.SqlJobRunStore, label: str, batch: int) -> tuple[float, float]:
    registry = jobrun.JobRegistry()
    registry.register("bench", "write", lambda p: jobrun.PassResult(done=True))
    began = time.perf_counter()
    for number in range(batch):
        await jobrun.start_job_run(
            store, module_id="bench", job="write", instance=f"{label}-{number}"
        )
    started = time.perf_counter()
    report = await jobrun.run_due_jobs(store, registry, limit=batch)
    finished = time.perf_counter()
    assert report.completed == batch, report
    return (started - began) / batch, (finished - started) / batch


async def measure(
    databases: harness.Databases, backend: str, history: int, rounds: int, batch: int
) -> dict[str, Any]:
    engines = {
        variant: await _database(databases, backend, variant, history) for variant in VARIANTS
    }

    def sample(variant: str) -> Any:
        store = jobrun.SqlJobRunStore(engines[variant])
        numbers = itertools.count()  # the round: a new instance name in each
        return lambda: _round(store, f"r{next(numbers)}", batch)

    variants = {variant: sample(variant) for variant in VARIANTS}
    samples = await harness.interleave_samples(variants, rounds, warm_ups=0, collect=False)
    for engine in engines.values():
        await engine.dispose()
    return {
        variant: tuple(statistics.median(each[part] for each in values) * 1e6 for part in (0, 1))
        for variant, values in samples.items()
    }


async def scenario(args: Any) -> None:
    history, rounds, batch = (
        (2_000, 4, 20) if args.quick else (args.history, args.rounds or 20, args.batch)
    )
    print(f"median µs per run, {rounds} rounds of {batch}, {history:,} finished runs kept")
    results: dict[str, Any] = {"history": history, "rounds": rounds, "batch": batch}
    for backend in harness.backends(args):
        found = await measure(args.databases, backend, history, rounds, batch)
        (start_with, finish_with), (start_without, finish_without) = found["with"], found["without"]
        label = "SQLite" if backend == "sqlite" else "Postgres"
        print(
            f"  {label:8} start {start_with:.0f} vs {start_without:.0f} µs "
            f"(x{start_with / start_without:.2f}), finish {finish_with:.0f} vs "
            f"{finish_without:.0f} µs (x{finish_with / finish_without:.2f})"
        )
        results[backend] = {
            f"{part}_us_{variant}": found[variant][index]
            for variant in VARIANTS
            for index, part in enumerate(("start", "finish"))
        }
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, history=200_000, batch=100)
