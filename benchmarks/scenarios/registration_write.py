"""What one registration heartbeat costs a worker on a SQLite file it has not open.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python -m benchmarks registration_write              # 40 files, 5 rounds
    .venv/bin/python -m benchmarks registration_write --files 100 --rounds 3

Two ways of writing the worker's row in each of ``--files`` migrated files, interleaved
round by round: through an engine opened for the write and closed after it (what the
worker did before: an aiosqlite thread started, the store's schema check, the engine
disposed when another file needed its place), and through a stdlib connection in a
thread of the loop's pool (``jobrun.sql.next_due.sqlite_beat_worker``, what it does
now). The figure is the process's CPU time per write, medians over the rounds, with
their spread and the ratio taken within this run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
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


async def _files(folder: Path, count: int) -> list[Path]:
    paths = []
    for index in range(count):
        path = folder / f"scope-{index}.db"
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        await jobrun.upgrade(engine)
        await engine.dispose()
        paths.append(path)
    return paths


async def _measure(files: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-registration-") as folder:
        paths = await _files(Path(folder), files)
        blank = WorkerRow("bench", "bench", "host", os.getpid(), "[]", "", "", "")
        row = beat_row(blank, datetime.now(UTC), 10.0)
        ways = {"engine opened for it": _through_engine, "stdlib, in a thread": _through_file}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()
    cpu_ms = asyncio.run(_measure(args.files, args.rounds))
    print(f"CPU per write, {args.files} files x {args.rounds} rounds (load {load[0]:.2f})")
    for name, samples in cpu_ms.items():
        print(
            f"  {name:<22} median {statistics.median(samples):6.2f} ms"
            f"  (min {min(samples):.2f}, max {max(samples):.2f})"
        )
    engine, stdlib = (statistics.median(samples) for samples in cpu_ms.values())
    print(f"  ratio engine / stdlib: {engine / stdlib:.1f}x")


if __name__ == "__main__":
    main()
