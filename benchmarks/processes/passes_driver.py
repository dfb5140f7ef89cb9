"""A driver process of the passes scenario: ``python -m benchmarks.processes.passes_driver
VARIANT URL TASKS STEPS SECONDS``, driven over stdin and stdout.

``TASKS`` loops in flight of one variant: the raw floor (three autocommit asyncpg
statements a pass on jobrun's own tables: claim, step, commit) or jobrun's
``run_due_jobs(limit=1)``, counting its claim statements at the store's executor. It
warms up, prints ``ready``, waits for a line on stdin, runs ``SECONDS``, then prints
what it counted as one JSON line. ``JOBRUN_BENCH_CODE=DIR`` runs DIR's jobrun
(see ``benchmarks/__init__.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks.harness import plain_url, trivial_steps
from jobrun._core.model.formats import format_instant
from jobrun._host.system import system_clock

MODULE_ID, JOB = "bench", "passes"
WARMUP_S = 1.0
MAX_POOL = 8
LEASE = "2999-01-01T00:00:00.000Z"

# The floor: jobrun's tables, the claim-order index, three autocommit statements.
FLOOR_CLAIM = """
UPDATE _substrat_job_runs SET lease_owner = $1, lease_driver = 'floor', lease_began_at = $2,
       next_attempt_at = $3, lease_epoch = lease_epoch + 1
WHERE id = (
    SELECT id FROM _substrat_job_runs
    WHERE status = 'running' AND coalesce(next_attempt_at, started_at) <= $2
    ORDER BY status, priority DESC, coalesce(next_attempt_at, started_at), id
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, cursor
"""
FLOOR_STEP = """
INSERT INTO _substrat_job_steps (run_id, step, result, attempts, last_error, recorded_at)
VALUES ($1, $2, $3, 1, NULL, $4)
ON CONFLICT (run_id, step) DO UPDATE SET result = excluded.result, attempts = excluded.attempts,
    last_error = excluded.last_error, recorded_at = excluded.recorded_at
"""
FLOOR_COMMIT = """
WITH dropped AS (DELETE FROM _substrat_job_steps WHERE run_id = $1)
UPDATE _substrat_job_runs SET cursor = $2, lease_owner = NULL, lease_driver = NULL,
       lease_began_at = NULL, next_attempt_at = NULL, updated_at = $3
WHERE id = $1 AND lease_owner = $4
"""


def now_at() -> str:
    return format_instant(system_clock())


async def floor_loop(pool: Any, steps: int, deadline: float, counted: dict[str, int]) -> None:
    # A connection from the pool per statement, as jobrun's store takes them.
    while time.monotonic() < deadline:
        at = now_at()
        token = uuid.uuid4().hex
        claimed = await pool.fetchrow(FLOOR_CLAIM, token, at, LEASE)
        if claimed is None:
            counted["found nothing due"] += 1
            await asyncio.sleep(0.001)  # poll interval, as the jobrun loop's
            continue
        run_id, cursor = claimed
        for index in range(steps):
            await pool.fetchval(FLOOR_STEP, run_id, f"s{index}", str(index), at)
        following = str(int(cursor or 0) + 1)
        await pool.execute(FLOOR_COMMIT, run_id, following, now_at(), token)
        counted["passes"] += 1


async def jobrun_loop(
    store: Any, registry: jobrun.JobRegistry, deadline: float, counted: dict[str, int]
) -> None:
    while time.monotonic() < deadline:
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        counted["passes"] += report.advanced + report.completed
        if report.attempted == 0:
            counted["found nothing due"] += 1
            await asyncio.sleep(0.001)  # poll interval: every run was leased a moment ago


async def child(variant: str, url: str, tasks: int, steps: int, seconds: float) -> None:
    counted = {"passes": 0, "found nothing due": 0, "claims": 0}
    async with _loops(variant, url, tasks, steps) as loop:
        await asyncio.gather(*(loop(time.monotonic() + WARMUP_S, counted) for _ in range(tasks)))
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # go
        counted = dict.fromkeys(counted, 0)
        cpu_s, started = time.process_time(), time.perf_counter()
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(loop(deadline, counted) for _ in range(tasks)))
        spent = {"cpu_s": time.process_time() - cpu_s, "wall_s": time.perf_counter() - started}
    print(json.dumps(counted | spent), flush=True)


@contextlib.asynccontextmanager
async def _loops(variant: str, url: str, tasks: int, steps: int) -> AsyncIterator[Any]:
    if variant == "floor":
        pool = await asyncpg.create_pool(plain_url(url), min_size=1, max_size=_pool_size(tasks))
        try:
            yield lambda deadline, counted: floor_loop(pool, steps, deadline, counted)
        finally:
            await pool.close()
        return
    engine = create_async_engine(url, pool_size=_pool_size(tasks), max_overflow=0)
    sent: Counter[str] = Counter()

    @contextlib.asynccontextmanager
    async def counting(operation: str, sql: str, parameters: Any) -> AsyncIterator[None]:
        sent[operation] += 1
        yield

    store = jobrun.SqlJobRunStore(engine, statement_hook=counting)
    registry = jobrun.JobRegistry()
    registry.register(MODULE_ID, JOB, trivial_steps(steps, cycle=True))

    async def loop(deadline: float, counted: dict[str, int]) -> None:
        if not counted["passes"]:
            sent.clear()  # the first loop of a window: count from here
        await jobrun_loop(store, registry, deadline, counted)
        for operation, count in sent.items():
            counted[f"statements: {operation}"] = count
        counted["claims"] = sent["claim"]

    try:
        yield loop
    finally:
        await engine.dispose()


def _pool_size(tasks: int) -> int:
    # The server's 100 connections are shared: at most 8 per process (both variants).
    return min(tasks, MAX_POOL)


if __name__ == "__main__":
    variant, url, tasks, steps, seconds = sys.argv[1:6]
    asyncio.run(child(variant, url, int(tasks), int(steps), float(seconds)))
