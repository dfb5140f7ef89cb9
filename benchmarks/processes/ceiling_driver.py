"""A driver process of the postgres_ceiling scenario (``multiprocessing``, spawned):
``--in-flight`` loops of ``run_due_jobs(limit=1)`` on an engine whose connections are
named ``jobrun-ceiling`` (so the parent finds their server backends), driven over a pipe:
it warms up, says ``ready``, runs ``--seconds`` on ``go`` and sends what it counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks.harness import trivial_steps

APPLICATION = "jobrun-ceiling"
MODULE_ID, JOB = "ceiling", "cycle"
WARMUP_S = 1.0


async def drive_until(
    store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, tasks: int, deadline: float
) -> Counter[str]:
    """``tasks`` loops of ``run_due_jobs(limit=1)`` until ``deadline`` (monotonic)."""
    totals: Counter[str] = Counter()

    async def loop() -> None:
        while time.monotonic() < deadline:
            report = await jobrun.run_due_jobs(store, registry, limit=1)
            totals["passes"] += report.advanced + report.completed
            totals["not committed"] += report.superseded + report.retrying + report.failed
            if report.attempted == 0:
                totals["found nothing due"] += 1
                await asyncio.sleep(0.001)  # poll interval: every run was leased a moment ago

    await asyncio.gather(*(loop() for _ in range(tasks)))
    return totals


async def driver(
    url: str, in_flight: int, steps: int, seconds: float, count: bool, pipe: Any
) -> None:
    engine = create_async_engine(
        url,
        pool_size=in_flight,
        max_overflow=0,
        connect_args={"server_settings": {"application_name": APPLICATION}},
    )
    sent: Counter[str] = Counter()

    @contextlib.asynccontextmanager
    async def counting(operation: str, sql: str, parameters: Any) -> AsyncIterator[None]:
        sent[f"statements: {operation}"] += 1
        yield

    store = jobrun.SqlJobRunStore(engine, statement_hook=counting if count else None)
    registry = jobrun.JobRegistry()
    registry.register(MODULE_ID, JOB, trivial_steps(steps, cycle=True))
    try:
        await drive_until(store, registry, in_flight, time.monotonic() + WARMUP_S)
        pipe.send("ready")
        await asyncio.to_thread(pipe.recv)  # go
        sent.clear()
        totals = await drive_until(store, registry, in_flight, time.monotonic() + seconds)
        pipe.send(dict(totals + sent))
        await asyncio.to_thread(pipe.recv)  # measured: close
    finally:
        await engine.dispose()


def driver_process(
    url: str, in_flight: int, steps: int, seconds: float, count: bool, pipe: Any
) -> None:
    asyncio.run(driver(url, in_flight, steps, seconds, count, pipe))
