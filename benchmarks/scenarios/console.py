"""The console's runs page with 1,000,000 finished runs kept: server time per request.

Goal (issue 14): the runs page answers in under 100 ms of server time. The app is
called in process through httpx's ASGI transport, so the time is the server's
(routing, store reads, rendering), with no network. Reported: the median and the
90th percentile over ``--repeat`` requests of each page, after two warm-up calls.

    .venv/bin/python -m benchmarks console                # SQLite and Postgres
    .venv/bin/python -m benchmarks console --sqlite-only --quick
    .venv/bin/python -m benchmarks console --sqlite-only --only activity

The history is filled with one INSERT ... SELECT per database (``_console_history``):
runs of 20 jobs started 2.592 s apart, ids real ULIDs of their start, 1% failed, the
newest 50 running (10 of them stranded). Each page variant is listed by ``_pages``.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks import harness
from benchmarks.scenarios._console_history import FIRST_MS, STEP_MS, fill, ulid_time
from jobrun.ui import create_app

GOAL_MS = 100.0


def _pages(count: int) -> dict[str, str]:
    """Every runs-page variant, with filters chosen to be hard: the middle page, a job
    holding 1 run in 20, 1% failed, a tenant prefix matching 1 run in 1,000 spread over
    the whole history, and the last hour (1,800 runs)."""
    middle_ms = FIRST_MS + (count // 2) * STEP_MS
    middle = ulid_time(middle_ms) + f"{count // 2:016d}"
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


def _request(client: httpx.AsyncClient, path: str) -> harness.Sample:
    async def sample() -> float:
        began = time.perf_counter()
        response = await client.get(path)
        elapsed = (time.perf_counter() - began) * 1000
        assert response.status_code == 200, path
        return elapsed

    return sample


async def _time_pages(
    engine: AsyncEngine, count: int, repeat: int, only: str | None = None
) -> dict[str, list[float]]:
    pages = {name: path for name, path in _pages(count).items() if not only or only in name}
    app = create_app({"bench": engine})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        variants = {name: _request(client, path) for name, path in pages.items()}
        # Interleaved, so a noisy neighbour spreads over every page alike.
        return await harness.interleave_samples(
            variants, repeat, order="same", warm_ups=2, collect=False
        )


def _report(backend: str, count: int, fill_s: float, samples: dict[str, list[float]]) -> Any:
    print(f"\n{backend}: {count:,} runs kept (filled in {fill_s:.1f} s)")
    print(f"  {'page':<36} {'median ms':>10} {'p90 ms':>8}  goal < {GOAL_MS:.0f} ms")
    found: dict[str, Any] = {"runs": count, "fill_s": round(fill_s, 2), "pages": {}}
    for name, values in samples.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        median = statistics.median(values)
        verdict = "ok" if median < GOAL_MS else "OVER"
        print(f"  {name:<36} {median:>10.1f} {p90:>8.1f}  {verdict}")
        found["pages"][name] = {"median_ms": round(median, 2), "p90_ms": round(p90, 2)}
    return found


async def scenario(args: Any) -> None:
    count = 10_000 if args.quick else 1_000_000
    repeat = 5 if args.quick else args.repeat
    chosen = ["sqlite"] if args.sqlite_only else ["postgres"] if args.postgres_only else []
    results = {}
    for backend in chosen or ["sqlite", "postgres"]:
        engine = args.databases.engine_for(await args.databases.url(backend))
        fill_s = await fill(engine, count, postgres=backend == "postgres")
        samples = await _time_pages(engine, count, repeat, args.only)
        await engine.dispose()
        label = "SQLite" if backend == "sqlite" else "Postgres"
        results[backend] = _report(label, count, fill_s, samples)
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, postgres_only=False, repeat=30, only="")
