"""What one registration heartbeat costs a worker on a SQLite file it has not open.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks registration_write              # 40 files, 5 rounds
    .venv/bin/python -m benchmarks registration_write --files 100 --rounds 3
    .venv/bin/python -m benchmarks registration_write --quick      # 5 files, 2 rounds

Two ways of writing the worker's row in each of ``--files`` migrated files, interleaved
round by round: through an engine opened for the write and closed after it (what the
worker did before: an aiosqlite thread started, the store's schema check, the engine
disposed when another file needed its place), and through a stdlib connection in a
thread of the loop's pool (``jobrun.sql.next_due.sqlite_beat_worker``, what it does
now). SQLite only (``--postgres-url`` is not used). The figure is the process's CPU
time per write, medians over the rounds with their spread, and the ratio of the two
taken round by round.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks import harness
from jobrun._core import WorkerRow
from jobrun._core.operator.worker_registry import beat_row
from jobrun.sql.next_due import sqlite_beat_worker


async def _through_engine(path: Path, row: WorkerRow) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    try:
        await jobrun.SqlJobRunStore(engine).beat_worker(row)
    finally:
        await engine.dispose()


async def _through_file(path: Path, row: WorkerRow) -> None:
    await asyncio.to_thread(sqlite_beat_worker, path, row, None)


async def _measure(paths: list[Path], rounds: int) -> dict[str, list[float]]:
    blank = WorkerRow("bench", "bench", "host", os.getpid(), "[]", "", "", "")
    row = beat_row(blank, datetime.now(UTC), 10.0)
    ways = {"engine": _through_engine, "stdlib": _through_file}
    cpu_ms: dict[str, list[float]] = {name: [] for name in ways}
    for number in range(rounds):
        # Rotated each round, so a noisy neighbour falls on both alike.
        order = list(ways) if number % 2 == 0 else list(reversed(ways))
        for name in order:
            began = time.process_time()
            for path in paths:
                await ways[name](path, row)
            cpu_ms[name].append((time.process_time() - began) / len(paths) * 1000)
    return cpu_ms


async def scenario(args: Any) -> None:
    files = 5 if args.quick else args.files
    rounds = args.rounds or (2 if args.quick else 5)
    paths = await harness.migrated_sqlite_files(args.databases.folder, files)
    cpu_ms = await _measure(paths, rounds)
    results: dict[str, Any] = {name: harness.spread(samples) for name, samples in cpu_ms.items()}
    results["engine/stdlib"] = harness.round_ratios(cpu_ms["engine"], cpu_ms["stdlib"])
    rows = [
        [name, f"{found['median']:.2f}", f"{found['min']:.2f}-{found['max']:.2f}"]
        for name, found in results.items()
    ]
    harness.table(
        f"CPU ms per write, {files} files x {rounds} rounds (load {harness.load()[0]})",
        ["way (ratio: per round)", "median", "spread"],
        rows,
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, files=40)
