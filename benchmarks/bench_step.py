"""A new step against the floors: the raw driver's durable one-row upsert, and SQLAlchemy's.

Per dialect, interleaved in one process, each sample N operations, ms per operation:

* raw driver: a one-row ``INSERT ... ON CONFLICT DO UPDATE`` into a table shaped
  like the step ledger, on one driver connection in autocommit (aiosqlite with
  WAL and ``synchronous=NORMAL``; asyncpg), so durable when it returns;
* raw driver + fence: jobrun's own step statement (the upsert guarded by the
  ``EXISTS`` on the held run, ``FOR SHARE`` on Postgres) on a connection alike;
  and on Postgres the same without ``FOR SHARE``, to price the lock;
* SQLAlchemy floor: the raw upsert inside ``engine.begin()``;
* jobrun step: ``await p.step(name, fn)`` with a trivial body, timed inside the
  handler over N new steps (the pass's claim and commit are outside the timing).

On SQLite each variant writes its own database file (all configured alike), so
each pays the WAL checkpoints its own commits cause; the harness collects garbage
before every sample, so no variant pays for another's. Both were needed for
stable ratios: see the README.

``--dbos`` adds DBOS Transact (the ``bench`` extra) in a child process per dialect:
a workflow of N trivial ``@DBOS.step`` calls against a jobrun pass of N steps.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from harness import (
    backends,
    driver_dsn,
    fresh_engine,
    interleave,
    options,
    profiled,
    save,
    table,
    timed_ms,
)
from sqlalchemy import event, text

import jobrun

SCRATCH = (
    "CREATE TABLE IF NOT EXISTS bench_upsert (run_id TEXT NOT NULL, step TEXT NOT NULL, "
    "result TEXT, attempts INTEGER NOT NULL, last_error TEXT, recorded_at TEXT NOT NULL, "
    "PRIMARY KEY (run_id, step))"
)
UPSERT = (
    "INSERT INTO bench_upsert (run_id, step, result, attempts, last_error, recorded_at) "
    "VALUES ({0}) ON CONFLICT (run_id, step) DO UPDATE SET result = excluded.result, "
    "attempts = excluded.attempts, last_error = excluded.last_error, "
    "recorded_at = excluded.recorded_at"
)
FENCED = (
    "INSERT INTO _substrat_job_steps (run_id, step, result, attempts, last_error, recorded_at) "
    "SELECT {p1}, {p2}, '1', 1, NULL, '2026-01-01T00:00:00.000Z' WHERE EXISTS (SELECT 1 FROM "
    "_substrat_job_runs WHERE id = {p1} AND status = 'running' AND lease_owner = {p3}{lock}) "
    "ON CONFLICT (run_id, step) DO UPDATE SET result = excluded.result"
)


class Raw:
    """One driver connection in autocommit, and the statements the floors send."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.connection: Any = None

    async def open(self, engine: Any) -> None:
        if self.backend == "sqlite":
            import aiosqlite

            self.connection = await aiosqlite.connect(driver_dsn(engine), isolation_level=None)
            for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 30000"):
                await self.connection.execute(f"PRAGMA {pragma}")
        else:
            import asyncpg

            self.connection = await asyncpg.connect(driver_dsn(engine))
        await self.execute(SCRATCH, [])

    async def execute(self, sql: str, values: list[Any]) -> None:
        if self.backend == "sqlite":
            await self.connection.execute_fetchall(sql, values)
        else:
            await self.connection.execute(sql, *values)

    def marks(self, count: int) -> str:
        if self.backend == "sqlite":
            return ", ".join("?" * count)
        return ", ".join(f"${n}" for n in range(1, count + 1))

    def fenced(self, lock: bool) -> str:
        if self.backend == "sqlite":
            return FENCED.format(p1="?1", p2="?2", p3="?3", lock="")
        return FENCED.format(p1="$1", p2="$2", p3="$3", lock=" FOR SHARE" if lock else "")


def _like_the_floor(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 30000"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


async def variants(
    backend: str, args: Any, engines: list[Any], n: int
) -> tuple[dict[str, Any], Any, Raw]:
    """The floors, each on its own database (``own_engine``) when that is a SQLite file."""

    async def own_engine() -> Any:
        # SQLite: a file per variant, so each pays the WAL checkpoints of its own
        # commits (a checkpoint runs in whichever commit crosses the threshold, and
        # would otherwise land on the variant that happens to come next).
        if backend == "sqlite":
            engines.append(await fresh_engine(backend, args))
        return engines[-1]

    raw = Raw(backend)
    await raw.open(await own_engine())
    fence_engine = await own_engine()
    held = await held_run(jobrun.SqlJobRunStore(fence_engine), fence_engine)
    fence_raw = Raw(backend)
    await fence_raw.open(fence_engine)
    floor_engine = await own_engine()
    if backend == "sqlite":
        # Set up like the others (no jobrun store configures this file's connections).
        await floor_engine.dispose()
        event.listen(floor_engine.sync_engine, "connect", _like_the_floor)
    async with floor_engine.begin() as connection:
        await connection.execute(text(SCRATCH))
    upsert = UPSERT.format(raw.marks(6))
    row = ["r", "", '"x"', 1, None, "2026-01-01T00:00:00.000Z"]

    async def raw_upsert() -> float:
        started = time.perf_counter()
        for _ in range(n):
            row[1] = uuid.uuid4().hex
            await raw.execute(upsert, row)
        return timed_ms(started, n)

    def fenced(lock: bool) -> Any:
        sql = fence_raw.fenced(lock)

        async def sample() -> float:
            started = time.perf_counter()
            for _ in range(n):
                await fence_raw.execute(sql, [held[0], uuid.uuid4().hex, held[1]])
            return timed_ms(started, n)

        return sample

    async def sqlalchemy_floor() -> float:
        statement = text(UPSERT.format(", ".join(f":v{i}" for i in range(6))))
        started = time.perf_counter()
        for _ in range(n):
            row[1] = uuid.uuid4().hex
            async with floor_engine.begin() as connection:
                await connection.execute(statement, {f"v{i}": row[i] for i in range(6)})
        return timed_ms(started, n)

    chosen = {"raw driver": raw_upsert, "raw driver + fence": fenced(True)}
    if backend == "postgres":
        chosen["raw driver + fence, no FOR SHARE"] = fenced(False)
    chosen["SQLAlchemy floor"] = sqlalchemy_floor

    async def close() -> None:
        await raw.connection.close()
        await fence_raw.connection.close()

    await own_engine()  # the jobrun step's file
    return chosen, close, raw


def step_runner(store: jobrun.SqlJobRunStore, n: int) -> Any:
    """A pass of ``n`` new trivial steps; returns ms per step, timed inside the handler."""
    timing: list[float] = []
    registry = jobrun.JobRegistry()

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        started = time.perf_counter()
        for index in range(n):
            await p.step(f"s{index}", lambda index=index: index)
        timing.append(timed_ms(started, n))
        return jobrun.PassResult(done=True)

    registry.register("bench", "steps", handler)

    async def sample() -> float:
        await jobrun.start_job_run(store, module_id="bench", job="steps", instance=uuid.uuid4().hex)
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        assert report.completed == 1, report
        return timing.pop()

    return sample


async def paired(store: jobrun.SqlJobRunStore, raw: Raw, n: int) -> dict[str, float]:
    """Each new step next to one raw upsert (order alternating) inside one pass, timed
    one by one: both meet the same moment of a noisy machine. Microseconds per
    operation: wall median and mean, and the event loop thread's own CPU (mean)."""
    upsert = UPSERT.format(raw.marks(6))
    row = ["r", "", '"x"', 1, None, "2026-01-01T00:00:00.000Z"]
    wall: dict[str, list[float]] = {"raw": [], "jobrun": []}
    cpu = {"raw": 0.0, "jobrun": 0.0}

    async def one(side: str, operation: Any) -> None:
        started, used = time.perf_counter(), time.thread_time()
        await operation
        wall[side].append((time.perf_counter() - started) * 1e6)
        cpu[side] += (time.thread_time() - used) * 1e6

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(n):
            row[1] = uuid.uuid4().hex
            pair: list[tuple[str, Any]] = [
                ("raw", raw.execute(upsert, row)),
                ("jobrun", p.step(f"s{index}", lambda: 1)),
            ]
            for side, operation in pair if index % 2 else reversed(pair):
                await one(side, operation)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register("bench", "paired", handler)
    await jobrun.start_job_run(store, module_id="bench", job="paired", instance=uuid.uuid4().hex)
    gc.collect()
    assert (await jobrun.run_due_jobs(store, registry, limit=1)).completed == 1
    found: dict[str, float] = {}
    for side in ("raw", "jobrun"):
        found[f"{side} median"] = round(statistics.median(wall[side]), 1)
        found[f"{side} mean"] = round(statistics.mean(wall[side]), 1)
        found[f"{side} loop cpu"] = round(cpu[side] / n, 1)
    return found


async def held_run(store: jobrun.SqlJobRunStore, engine: Any) -> tuple[str, str]:
    """A running run leased to a token, for the fenced raw statements."""
    run = await jobrun.start_job_run(store, module_id="bench", job="held", instance="h")
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE _substrat_job_runs SET lease_owner = 'tok' WHERE id = :id"), {"id": run.id}
        )
    return run.id, "tok"


async def measure(backend: str, args: Any) -> dict[str, Any]:
    engines = [await fresh_engine(backend, args)]
    n = 20 if args.quick else args.n
    chosen, close, chosen_raw = await variants(backend, args, engines, n)
    # Last engine made: the jobrun store's own file on SQLite.
    store = jobrun.SqlJobRunStore(engines[-1])
    chosen["jobrun step"] = step_runner(store, n)
    medians = await interleave(chosen, args.rounds or (2 if args.quick else 9))
    # The table holds timings; the paired figures ride along (hence the ignore).
    medians["paired"] = await paired(store, chosen_raw, n * 10)  # type: ignore[assignment]
    if args.profile:
        runner = step_runner(store, n * 10)
        # The table holds timings; the profile rides along as text (hence the ignore).
        medians["profile"] = await profiled(f"{backend}: {n * 10} new steps", runner)  # type: ignore[assignment]
    await close()
    for engine in engines:
        await engine.dispose()
    return medians


def dbos_child(backend: str, args: Any) -> dict[str, Any]:
    """DBOS runs one global instance per process: each dialect in its own child."""
    command = [sys.executable, __file__.replace("bench_step", "bench_dbos"), backend]
    command += ["--n", str(20 if args.quick else args.n), "--postgres-url", args.postgres_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def scenario(args: Any) -> None:
    results: dict[str, Any] = {}
    for backend in backends(args):
        results[backend] = await measure(backend, args)
        if args.dbos and importlib.util.find_spec("dbos") is not None:
            results[backend]["dbos"] = dbos_child(backend, args)
    rows = []
    extras = ("profile", "dbos", "paired")
    names = [name for name in results[backends(args)[0]] if name not in extras]
    for name in names + ["raw driver + fence, no FOR SHARE"] * (not args.sqlite_only):
        if name in [row[0] for row in rows]:
            continue
        cells = [name]
        for backend in backends(args):
            value = results[backend].get(name)
            raw = results[backend]["raw driver"]
            cells.append("–" if value is None else f"{value:.3f} ({value / raw:.2f}x)")
        rows.append(cells)
    for backend in backends(args):
        dbos = results[backend].get("dbos")
        if dbos and "dbos_ms_per_step" in dbos:
            print(
                f"{backend}: DBOS {dbos['dbos_ms_per_step']:.3f} ms/step, jobrun in the same "
                f"child {dbos['jobrun_ms_per_step']:.3f} ({dbos['dbos_over_jobrun']:.1f}x)"
            )
    table("ms per durable one-row write (ratio to the raw driver)", ["", *backends(args)], rows)
    pairs = []
    for backend in backends(args):
        found = results[backend]["paired"]
        for measure_name in ("median", "mean", "loop cpu"):
            ours, floor = found[f"jobrun {measure_name}"], found[f"raw {measure_name}"]
            pairs.append([backend, measure_name, floor, ours, f"{ours / floor:.2f}x"])
    table(
        "paired inside one pass, µs per operation (each step next to one raw upsert)",
        ["", "", "raw driver", "jobrun step", "ratio"],
        pairs,
    )
    save(args, "step", results)


if __name__ == "__main__":
    asyncio.run(scenario(options(__doc__ or "", n=200, dbos=False)))
