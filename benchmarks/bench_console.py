"""The console's runs page with 1,000,000 finished runs kept: server time per request.

Goal (issue 14): the runs page answers in under 100 ms of server time. The app is
called in process through httpx's ASGI transport, so the time is the server's
(routing, store reads, rendering), with no network. Reported: the median and the
90th percentile over ``--repeat`` requests of each page, after two warm-up calls.

    .venv/bin/python benchmarks/bench_console.py                # SQLite and Postgres
    .venv/bin/python benchmarks/bench_console.py --sqlite-only --quick

The history is filled with one INSERT ... SELECT per database: runs of 20 jobs
started 2 s apart, ids real ULIDs of their start, 1% failed, the newest 50
running (10 of them stranded). Each page variant is listed by ``_pages``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.ui import create_app

POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_bench_console"
GOAL_MS = 100.0
STEP_MS = 2_592
"""Runs start 2.592 s apart: 1,000,000 runs span 30 days, as a busy history would."""
FIRST_MS = int(time.time()) * 1000 - 1_000_000 * STEP_MS
"""Whole seconds, so that the 1,000,000th run starts now: the activity chart and the
errors page read the history's last hour and day."""
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

_COLUMNS = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_owner, lease_driver, "
    "lease_began_at, lease_takeovers"
)


def _ulid_time(ms: str) -> str:
    """SQL for the 10 ULID characters of the millisecond ``ms`` (same on both engines)."""
    return " || ".join(
        f"substr('{_CROCKFORD}', CAST((({ms}) >> {5 * place}) & 31 AS INTEGER) + 1, 1)"
        for place in range(9, -1, -1)
    )


def _fill_select(i: str, ms: str, started_at: str, pad: str) -> str:
    """One run per ``i``: 20 jobs, 1,000 tenants, 1% failed spread over the history,
    the newest 50 running (the last 10 of them stranded: leased, lease expired)."""
    return f"""
SELECT {_ulid_time(ms)} || {pad}, 'shop', 'job-' || ({i} % 20),
       'tenant-' || ({i} % 1000) || '/' || {i}, '{{}}',
       CASE WHEN {i} > :count - 50 THEN 'running' WHEN ({i} / 20) % 100 = 0 THEN 'failed'
            ELSE 'done' END,
       NULL, '{{}}', 0,
       CASE WHEN ({i} / 20) % 100 = 0 THEN 'KeyError: order ' || {i} || ' not found' END,
       {started_at}, {started_at},
       CASE WHEN {i} > :count - 10 THEN {started_at} END,
       CASE WHEN {i} <= :count - 50 THEN {started_at} END,
       CASE WHEN {i} > :count - 10 THEN 'token' END,
       CASE WHEN {i} > :count - 10 THEN 'gone-host' END,
       CASE WHEN {i} > :count - 10 THEN {started_at} END, 0"""


_SQLITE_MS = f"({FIRST_MS} + i * {STEP_MS})"
_SQLITE_STARTED_AT = f"strftime('%Y-%m-%dT%H:%M:%fZ', {_SQLITE_MS} / 1000, 'unixepoch')"
_SQLITE_FILL = f"""
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)
INSERT INTO _substrat_job_runs ({_COLUMNS})
{_fill_select("i", _SQLITE_MS, _SQLITE_STARTED_AT, "printf('%016d', i)")}
FROM n
"""
_POSTGRES_MS = f"({FIRST_MS}::bigint + i::bigint * {STEP_MS})"
_POSTGRES_STARTED_AT = (
    f"to_char(to_timestamp({_POSTGRES_MS} / 1000) AT TIME ZONE 'UTC', "
    """'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"""
)
_POSTGRES_FILL = f"""
INSERT INTO _substrat_job_runs ({_COLUMNS})
{_fill_select("i", _POSTGRES_MS, _POSTGRES_STARTED_AT, "lpad(i::text, 16, '0')")}
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
        # What autovacuum does soon after a bulk load: statistics, and the visibility map
        # that lets a count read the index alone.
        async with engine.connect() as connection:
            autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.execute(text("VACUUM ANALYZE _substrat_job_runs"))
    return time.perf_counter() - began


async def _postgres_engine(url: str) -> AsyncEngine:
    admin = create_async_engine(url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    name = url.rsplit("/", 1)[1]
    async with admin.connect() as connection:
        await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    await admin.dispose()
    return create_async_engine(url)


def _pages(count: int) -> dict[str, str]:
    """Every runs-page variant, with filters chosen to be hard: the middle page, a job
    holding 1 run in 20, 1% failed, a tenant prefix matching 1 run in 1,000 spread over
    the whole history, and the last hour (1,800 runs)."""
    middle_ms = FIRST_MS + (count // 2) * STEP_MS
    middle = _python_ulid_time(middle_ms) + f"{count // 2:016d}"
    last_ms = FIRST_MS + count * STEP_MS
    since = datetime.fromtimestamp((last_ms - 3_600_000) / 1000, UTC).strftime("%Y-%m-%dT%H:%M")
    job = "module=shop&job=job-2"
    return {
        "newest 50": "/db/0/runs",
        "old page (before the middle id)": f"/db/0/runs?before={middle}",
        "status=failed": "/db/0/runs?status=failed",
        "status=failed, old page": f"/db/0/runs?status=failed&before={middle}",
        "status=stranded": "/db/0/runs?status=stranded",
        "module+job": f"/db/0/runs?{job}",
        "module+job, old page": f"/db/0/runs?{job}&before={middle}",
        "module+job+status=failed": f"/db/0/runs?{job}&status=failed",
        "instance prefix": "/db/0/runs?instance=tenant-42/",
        "module+job+instance prefix": f"/db/0/runs?{job}&instance=tenant-42/",
        "started since (last hour)": f"/db/0/runs?since={since}",
        "started since + status=failed": f"/db/0/runs?since={since}&status=failed",
        "module+job+started since": f"/db/0/runs?{job}&since={since}",
        "health": "/health",
        "activity, last hour per minute": "/db/0/activity",
        "activity, last day per hour": "/db/0/activity?per=hour",
        "activity of one job, last day": f"/db/0/activity?per=hour&{job}",
        "workers": "/db/0/workers",
        "errors, last 24 hours": "/db/0/errors",
    }


def _python_ulid_time(ms: int) -> str:
    return "".join(_CROCKFORD[(ms >> (5 * place)) & 31] for place in range(9, -1, -1))


async def _time_pages(engine: AsyncEngine, count: int, repeat: int) -> dict[str, list[float]]:
    pages = _pages(count)
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
    print(f"  {'page':<36} {'median ms':>10} {'p90 ms':>8}  goal < {GOAL_MS:.0f} ms")
    for name, values in samples.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        median = statistics.median(values)
        verdict = "ok" if median < GOAL_MS else "OVER"
        print(f"  {name:<36} {median:>10.1f} {p90:>8.1f}  {verdict}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 runs, 5 requests each")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgres-only", action="store_true")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--repeat", type=int, default=30)
    options = parser.parse_args()
    count = 10_000 if options.quick else 1_000_000
    repeat = 5 if options.quick else options.repeat
    if not options.postgres_only:
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
