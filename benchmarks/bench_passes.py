"""Whole passes on Postgres at 1, 8 and 64 in flight, against a raw floor of the same work.

Each point is ``processes x drivers`` (1x1, 2x4 and 2x32 by default): that many
driver processes, each with that many tasks in flight, on an engine whose pool is
sized to its tasks up to 8 (the server's connections are shared). The floor
takes a connection from its asyncpg pool per statement, which costs it CPU that
jobrun's store, keeping its connections, does not pay: with many steps per pass
the "floor" is then slower than jobrun (read those ratios as before/after
only). The runs never end (each
pass does ``--steps`` new trivial steps and commits the next cursor, so the run
is due again at once), four runs per task, so no driver waits for work. Two
variants per point, interleaved (one sample of each per round, the order
flipped every round), fresh runs before each:

* **floor**: raw asyncpg, three autocommit statements per pass on jobrun's own
  tables and indexes: claim one due run ``FOR UPDATE SKIP LOCKED`` setting its
  lease; upsert each step; commit the cursor and drop the ledger;
* **jobrun**: each task calls ``jobrun.run_due_jobs(store, registry, limit=1)``
  in a loop (what a worker's driver does), counting its claim statements at the
  store's executor (``statement_hook``; a counter, a few tenths of a µs each).

Per sample: passes per second of wall time (all processes), the driver processes'
own CPU per pass (``time.process_time`` in each), claim statements per pass, the
load average. Reported: the median of the rounds with its spread, and the
floor/jobrun ratio as the median of per-round ratios. ``--pythonpath DIR`` runs
the jobrun variant on another checkout's code (its ``jobrun`` package first on the
path: a before/after in one run, the variants ``jobrun`` and ``jobrun@DIR``).
The database is a fresh one with a unique name, dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

# ``--pythonpath DIR``'s children: DIR's jobrun, imported before the harness puts this
# checkout first on the path (a module imported once is the one every import gets).
if os.environ.get("JOBRUN_BENCH_CODE"):
    sys.path.insert(0, os.environ["JOBRUN_BENCH_CODE"])
    import jobrun

import asyncpg
from harness import driver_dsn, options, save, spread, table
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._system import system_clock

MODULE_ID, JOB = "bench", "passes"
RUNS_PER_TASK = 4
WARMUP_S = 1.0
MAX_POOL = 8
LEASE = "2999-01-01T00:00:00.000Z"
HERE = Path(__file__).resolve().parent

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


# -- the children: one process each, driven over stdin/stdout -------------------------------


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


def registry_of(steps: int) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    async def cycle(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(steps):
            await p.step(f"s{index}", lambda index=index: index)
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    registry.register(MODULE_ID, JOB, cycle)
    return registry


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
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=_pool_size(tasks))
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
    registry = registry_of(steps)

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


# -- the parent -----------------------------------------------------------------------------


async def sample(
    args: Any, url: str, variant: str, processes: int, tasks: int, steps: int
) -> dict[str, Any]:
    """One sample: ``processes`` children of ``variant`` for ``args.seconds``."""
    environment = dict(os.environ)
    name = "floor" if variant == "floor" else "jobrun"
    if variant != "floor" and variant != "jobrun":
        environment["JOBRUN_BENCH_CODE"] = args.pythonpath
    command = [sys.executable, str(HERE / "bench_passes.py"), "--child", name, url]
    command += [str(tasks), str(steps), str(args.seconds)]
    children = [_spawn(command, environment) for _ in range(processes)]
    try:
        for process in children:
            assert process.stdout is not None
            line = await asyncio.to_thread(process.stdout.readline)
            assert line.strip() == "ready", line
        load = os.getloadavg()[0]
        for process in children:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        found = [json.loads(await asyncio.to_thread(_last_line, process)) for process in children]
    finally:
        for process in children:
            process.wait(timeout=120)
    passes = sum(one["passes"] for one in found)
    wall_s = max(one["wall_s"] for one in found)
    return {
        "passes_per_s": passes / wall_s,
        "cpu_us_per_pass": 1e6 * sum(one["cpu_s"] for one in found) / max(passes, 1),
        "claims_per_pass": sum(one["claims"] for one in found) / max(passes, 1),
        "found_nothing_due": sum(one["found nothing due"] for one in found),
        "load": load,
    }


def _spawn(command: list[str], environment: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
    )


def _last_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline()


async def fresh_runs(admin: Any, store: jobrun.SqlJobRunStore, count: int) -> None:
    await admin.execute("DELETE FROM _substrat_job_steps")
    await admin.execute("DELETE FROM _substrat_job_runs")
    await admin.execute("VACUUM ANALYZE _substrat_job_runs, _substrat_job_steps")
    for _ in range(count):
        await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, instance=uuid.uuid4().hex)


def summary(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    return spread([one[key] for one in samples])


async def measure_point(
    args: Any, url: str, admin: Any, store: Any, point: tuple[int, int], steps: int
) -> dict[str, Any]:
    processes, tasks = point
    variants = ["floor", "jobrun"] + ([f"jobrun@{args.pythonpath}"] if args.pythonpath else [])
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for round_number in range(args.rounds):
        for variant in variants if round_number % 2 == 0 else list(reversed(variants)):
            await fresh_runs(admin, store, processes * tasks * RUNS_PER_TASK)
            samples[variant].append(await sample(args, url, variant, processes, tasks, steps))
    found: dict[str, Any] = {"samples": samples}
    for variant in variants:
        found[variant] = {
            key: summary(samples[variant], key)
            for key in ("passes_per_s", "cpu_us_per_pass", "claims_per_pass", "load")
        }
        if variant != "floor":
            ratios = [
                floor["passes_per_s"] / max(ours["passes_per_s"], 1e-9)
                for floor, ours in zip(samples["floor"], samples[variant], strict=True)
            ]
            found[variant]["floor_over_jobrun"] = spread(ratios)
    return found


def rows_of(results: dict[str, Any], steps: int) -> list[list[Any]]:
    rows = []
    for label, found in results.items():
        for variant in [name for name in found if name != "samples" and name != "floor"]:
            ours, floor = found[variant], found["floor"]
            rows.append(
                [
                    label,
                    variant,
                    steps,
                    _cell(floor["passes_per_s"]),
                    _cell(ours["passes_per_s"]),
                    _cell(ours["floor_over_jobrun"], 2),
                    _cell(ours["claims_per_pass"], 2),
                    _cell(floor["cpu_us_per_pass"]),
                    _cell(ours["cpu_us_per_pass"]),
                    _cell(ours["load"], 1),
                ]
            )
    return rows


def _cell(found: dict[str, float], digits: int = 0) -> str:
    return f"{found['median']:.{digits}f} [{found['q1']:.{digits}f}–{found['q3']:.{digits}f}]"


async def scenario(args: Any) -> None:
    if args.sqlite_only:
        raise SystemExit("bench_passes.py measures Postgres only")
    database = f"jobrun_bench_passes_{uuid.uuid4().hex[:10]}"
    base = make_url(args.postgres_url)
    url = base.set(database=database).render_as_string(hide_password=False)
    admin_dsn = driver_dsn(create_async_engine(base.set(database="postgres")))
    server = await asyncpg.connect(admin_dsn)
    await server.execute(f'CREATE DATABASE "{database}"')
    engine = create_async_engine(url, pool_size=2)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        admin = await asyncpg.connect(driver_dsn(engine))
        try:
            await run_points(args, url, admin, store)
        finally:
            await admin.close()
    finally:
        await engine.dispose()
        await server.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await server.close()


async def run_points(args: Any, url: str, admin: Any, store: Any) -> None:
    points = [(1, 1), (1, 2)] if args.quick else [(1, 1), (2, 4), (2, 32)]
    step_counts = [int(count) for count in args.steps.split(",")]
    results: dict[str, Any] = {}
    for steps in step_counts:
        found = {
            f"{processes * tasks} ({processes}x{tasks})": await measure_point(
                args, url, admin, store, (processes, tasks), steps
            )
            for processes, tasks in points
        }
        results[f"{steps} steps"] = found
        table(
            f"Whole passes of {steps} step(s), median [IQR] of {args.rounds} rounds",
            [
                "in flight",
                "variant",
                "steps",
                "floor passes/s",
                "jobrun passes/s",
                "floor/jobrun",
                "claim stmts/pass",
                "floor CPU µs/pass",
                "jobrun CPU µs/pass",
                "load",
            ],
            rows_of(found, steps),
        )
    save(args, "bench_passes", results)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        variant, url, tasks, steps, seconds = sys.argv[2:7]
        asyncio.run(child(variant, url, int(tasks), int(steps), float(seconds)))
    else:
        parsed = options(__doc__.splitlines()[0], seconds=3.0, steps="1", pythonpath="")
        if parsed.rounds is None:
            parsed.rounds = 2 if parsed.quick else 5
        if parsed.quick:
            parsed.seconds = 1.0
        from harness import main

        main(scenario, parsed)
