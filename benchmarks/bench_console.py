"""The console's runs page with 1,000,000 finished runs kept: server time per request.

Goal (issue 14): the runs page answers in under 100 ms of server time. The app is
called in process through httpx's ASGI transport, so the time is the server's
(routing, store reads, rendering), with no network. Reported: the median and the
90th percentile over ``--repeat`` requests of each page, after two warm-up calls.

    .venv/bin/python benchmarks/bench_console.py                # SQLite and Postgres
    .venv/bin/python benchmarks/bench_console.py --sqlite-only --quick

The history is filled with one INSERT ... SELECT per database (done runs of 20
jobs, ids ascending like ULIDs), plus 50 running and 50 failed runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.ui import create_app

POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_bench_console"
GOAL_MS = 100.0

_COLUMNS = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_takeovers"
)
_SQLITE_FILL = f"""
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)
INSERT INTO _substrat_job_runs ({_COLUMNS})
SELECT printf('%026d', i), 'shop', 'job-' || (i % 20), 'instance-' || i, '{{}}',
       CASE WHEN i > :count - 50 THEN 'running' WHEN i > :count - 100 THEN 'failed'
            ELSE 'done' END,
       NULL, '{{}}', 0, NULL,
       '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:01.000Z', NULL,
       CASE WHEN i > :count - 50 THEN NULL ELSE '2026-01-01T00:00:01.000Z' END, 0
FROM n
"""
_POSTGRES_FILL = f"""
INSERT INTO _substrat_job_runs ({_COLUMNS})
SELECT lpad(i::text, 26, '0'), 'shop', 'job-' || (i % 20), 'instance-' || i, '{{}}',
       CASE WHEN i > :count - 50 THEN 'running' WHEN i > :count - 100 THEN 'failed'
            ELSE 'done' END,
       NULL, '{{}}', 0, NULL,
       '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:01.000Z', NULL,
       CASE WHEN i > :count - 50 THEN NULL ELSE '2026-01-01T00:00:01.000Z' END, 0
FROM generate_series(1, :count) AS i
"""


async def _fill(engine: AsyncEngine, count: int, postgres: bool) -> float:
    began = time.perf_counter()
    await jobrun.upgrade(engine)
    async with engine.begin() as connection:
        await connection.execute(
            text(_POSTGRES_FILL if postgres else _SQLITE_FILL), {"count": count}
        )
        if postgres:
            await connection.execute(text("ANALYZE _substrat_job_runs"))
    return time.perf_counter() - began


async def _postgres_engine(url: str) -> AsyncEngine:
    admin = create_async_engine(url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    name = url.rsplit("/", 1)[1]
    async with admin.connect() as connection:
        await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    await admin.dispose()
    return create_async_engine(url)


async def _time_pages(engine: AsyncEngine, count: int, repeat: int) -> dict[str, list[float]]:
    middle = f"{count // 2:026d}"
    pages = {
        "runs (newest 50)": "/db/0/runs",
        "runs, an old page (before the middle id)": f"/db/0/runs?before={middle}",
        "runs, status=failed": "/db/0/runs?status=failed",
        "runs, module+job filter": "/db/0/runs?module=shop&job=job-7",
        "health": "/health",
    }
    samples: dict[str, list[float]] = {name: [] for name in pages}
    app = create_app({"bench": engine})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for path in pages.values():
            for _ in range(2):
                assert (await client.get(path)).status_code == 200, path
        for _ in range(repeat):
            # Interleaved, so a noisy neighbour spreads over every page alike.
            for name, path in pages.items():
                began = time.perf_counter()
                response = await client.get(path)
                samples[name].append((time.perf_counter() - began) * 1000)
                assert response.status_code == 200
    return samples


def _report(backend: str, count: int, fill_s: float, samples: dict[str, list[float]]) -> None:
    print(f"\n{backend}: {count:,} runs kept (filled in {fill_s:.1f} s)")
    print(f"  {'page':<44} {'median ms':>10} {'p90 ms':>8}  goal < {GOAL_MS:.0f} ms")
    for name, values in samples.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        median = statistics.median(values)
        verdict = "ok" if median < GOAL_MS else "OVER"
        print(f"  {name:<44} {median:>10.1f} {p90:>8.1f}  {verdict}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 runs, 5 requests each")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--repeat", type=int, default=30)
    options = parser.parse_args()
    count = 10_000 if options.quick else 1_000_000
    repeat = 5 if options.quick else options.repeat
    with tempfile.TemporaryDirectory() as folder:
        engine = create_async_engine(f"sqlite+aiosqlite:///{Path(folder) / 'console.db'}")
        try:
            fill_s = await _fill(engine, count, postgres=False)
            _report("SQLite", count, fill_s, await _time_pages(engine, count, repeat))
        finally:
            await engine.dispose()
    if not options.sqlite_only:
        engine = await _postgres_engine(options.postgres_url)
        try:
            fill_s = await _fill(engine, count, postgres=True)
            _report("Postgres", count, fill_s, await _time_pages(engine, count, repeat))
        finally:
            await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
