"""What the console's two indexes cost a start and a finish.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_console_indexes.py                # SQLite + Postgres
    .venv/bin/python benchmarks/bench_console_indexes.py --quick --sqlite-only

Two databases per backend, both at head and holding the same ``--history`` of
finished runs (filled as ``bench_console.py`` does); in one, the console's indexes
(``_substrat_job_runs_job_status``, ``_substrat_job_runs_status``) are dropped.
Each round starts ``--batch`` runs in each database (timed one by one), then
finishes them with ``run_due_jobs`` (a handler done in one pass; timed per run),
the two databases taking turns first, so noise spreads over both alike.
Medians in microseconds, and the ratio with the indexes to without.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout and this folder come first on the path,
# so the imports below must follow this (hence their noqa: E402).
ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_console import _fill, _postgres_engine  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

import jobrun  # noqa: E402

CONSOLE_INDEXES = ("_substrat_job_runs_job_status", "_substrat_job_runs_status")
VARIANTS = ("with", "without")


async def _database(url: str | None, folder: Path, name: str, history: int) -> AsyncEngine:
    if url is None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{folder / name}.db")
    else:
        engine = await _postgres_engine(url.rsplit("/", 1)[0] + f"/jobrun_bench_{name}")
    await _fill(engine, history, postgres=url is not None)
    if name.endswith("without"):
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


async def measure(url: str | None, history: int, rounds: int, batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        engines = {
            variant: await _database(url, Path(directory), f"write_{variant}", history)
            for variant in VARIANTS
        }
        stores = {variant: jobrun.SqlJobRunStore(engine) for variant, engine in engines.items()}
        samples: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
        try:
            for number in range(rounds):
                order = VARIANTS if number % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    samples[variant].append(await _round(stores[variant], f"r{number}", batch))
        finally:
            for engine in engines.values():
                await engine.dispose()
    return {
        variant: tuple(statistics.median(each[part] for each in values) * 1e6 for part in (0, 1))
        for variant, values in samples.items()
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument(
        "--postgres-url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--history", type=int, default=200_000, help="finished runs kept")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100, help="runs started per round")
    args = parser.parse_args()
    history, rounds, batch = (
        (2_000, 4, 20) if args.quick else (args.history, args.rounds, args.batch)
    )
    backends: dict[str, str | None] = {"SQLite": None}
    if not args.sqlite_only:
        backends["Postgres"] = args.postgres_url
    print(f"median µs per run, {rounds} rounds of {batch}, {history:,} finished runs kept")
    for backend, url in backends.items():
        found = await measure(url, history, rounds, batch)
        (start_with, finish_with), (start_without, finish_without) = found["with"], found["without"]
        print(
            f"  {backend:8} start {start_with:.0f} vs {start_without:.0f} µs "
            f"(x{start_with / start_without:.2f}), finish {finish_with:.0f} vs "
            f"{finish_without:.0f} µs (x{finish_with / finish_without:.2f})"
        )


if __name__ == "__main__":
    asyncio.run(main())
