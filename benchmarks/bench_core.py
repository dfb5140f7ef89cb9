"""Core cost benchmark for jobrun: floors, steps, memo hits, pass commits, statement counts.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_core.py                # SQLite + Postgres, full
    .venv/bin/python benchmarks/bench_core.py --quick        # fast smoke run
    .venv/bin/python benchmarks/bench_core.py --sqlite-only --profile

Everything is measured in one process, interleaved: every round takes one sample
of every measurement, alternating the backends (and flipping their order each
round), so that noise from a shared machine spreads over all numbers alike.
Medians are reported. The statement and round-trip counts come from a separate
phase with listeners attached, so the listeners never slow the timed samples.

Measurements, per backend (SQLite file in a temp dir; Postgres at ``--postgres-url``):

* floors: one committed single-row ``INSERT ... ON CONFLICT DO UPDATE`` inside
  ``engine.begin()``; the same in autocommit (Postgres only: what the store
  does for a step write); a two-statement transaction (UPDATE + DELETE, the
  shape of a pass commit); a one-row read through ``engine.connect()``;
* steps: one pass of K new trivial steps through ``jobrun.run_due_jobs``;
* replay: the same pass failing after its K steps (``base_delay_ms=0``), then
  the next drive replaying all K as memo hits;
* passes: a handler with no steps advancing its cursor, ``max_passes=P``;
* counts: statements (``before_cursor_execute``) and driver round trips per
  store operation (SQLite: aiosqlite worker-thread hops; Postgres: statements +
  BEGIN/COMMIT/ROLLBACK + PREPAREs).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import io
import json
import os
import platform
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Runnable as a plain script from a checkout, installed or not.
    sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402
from sqlalchemy import Column, MetaData, Table, Text, delete, event, make_url, select, update  # noqa: E402
from sqlalchemy.dialects import postgresql, sqlite  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

import jobrun  # noqa: E402
from jobrun.sql import schema  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_bench"
MODULE = "bench"
STORE_OPS = (
    "claim",
    "extend_lease",
    "get",
    "steps",
    "record_step",
    "commit_pass",
    "patch",
    "start_or_join",
)
FLOOR_NAMES = (
    "floor_1row_ms",
    "floor_1row_cpu_ms",
    "floor_1row_autocommit_ms",
    "floor_driver_1row_ms",
    "floor_2stmt_ms",
    "floor_read_ms",
)
RESULT_KEYS = ("meta", "backends")
BACKEND_KEYS = ("floors", "steps", "replay", "passes", "counts")

scratch_metadata = MetaData()
scratch = Table(
    "bench_scratch",
    scratch_metadata,
    Column("k", Text, primary_key=True),
    Column("v", Text, nullable=False),
)


# --------------------------------------------------------------------------- helpers


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6


def cpu_ms() -> float:
    """CPU time of this process, all threads (the event loop and aiosqlite's worker)."""
    return time.process_time_ns() / 1e6


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rnd(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


class Counter:
    """Statements and driver round trips, attributed to the store operation running."""

    def __init__(self) -> None:
        self.enabled = False
        self.current: str | None = None
        self.reset()

    def reset(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.statements: dict[str, int] = defaultdict(int)
        self.trips: dict[str, int] = defaultdict(int)
        self.kinds: dict[str, int] = defaultdict(int)

    def statement(self) -> None:
        if self.enabled:
            self.statements[self.current or "other"] += 1

    def trip(self, kind: str) -> None:
        if self.enabled:
            self.trips[self.current or "other"] += 1
            self.kinds[kind] += 1

    def snapshot(self) -> dict[str, Any]:
        ops = sorted(set(self.calls) | set(self.statements) | set(self.trips))
        return {
            "per_op": {
                op: {
                    "calls": self.calls.get(op, 0),
                    "statements": self.statements.get(op, 0),
                    "round_trips": self.trips.get(op, 0),
                }
                for op in ops
            },
            "round_trip_kinds": dict(sorted(self.kinds.items())),
            "total_statements": sum(self.statements.values()),
            "total_round_trips": sum(self.trips.values()),
        }


class CountingStore:
    """Delegates to a store, telling the counter which operation is running."""

    def __init__(self, inner: jobrun.SqlJobRunStore, counter: Counter) -> None:
        self._inner = inner
        self._counter = counter

    @property
    def limits(self) -> jobrun.StoreLimits:
        return self._inner.limits

    @property
    def default_scope(self) -> object:
        return self._inner.default_scope

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in STORE_OPS:
            return attribute
        counter = self._counter

        async def counted(*args: Any, **kwargs: Any) -> Any:
            counter.calls[name] += 1
            counter.current = name
            try:
                return await attribute(*args, **kwargs)
            finally:
                counter.current = None

        return counted


@contextmanager
def driver_trip_counting(counter: Counter, dialect: str) -> Iterator[None]:
    """Count driver round trips by wrapping driver internals (counting phase only).

    SQLite: every aiosqlite call is one hop to its worker thread and back.
    Postgres: each executed statement is one round trip (counted by the event
    listener, added here as "statement"), plus BEGIN, COMMIT/ROLLBACK and PREPARE.
    """
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        patches.append((owner, name, original))
        setattr(owner, name, make(original))

    try:
        if dialect == "sqlite":
            import aiosqlite.core

            def hop(original: Any) -> Any:
                async def wrapped(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
                    counter.trip("aiosqlite hop")
                    return await original(self, fn, *args, **kwargs)

                return wrapped

            patch(aiosqlite.core.Connection, "_execute", hop)
        else:
            import asyncpg.connection
            from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

            def begin(original: Any) -> Any:
                async def wrapped(self: Any) -> Any:
                    if self.isolation_level != "autocommit":
                        counter.trip("BEGIN")
                    return await original(self)

                return wrapped

            def end(original: Any) -> Any:
                async def wrapped(self: Any, fn: Any) -> Any:
                    counter.trip(f"{fn.__name__.upper()}")
                    return await original(self, fn)

                return wrapped

            def prepare(original: Any) -> Any:
                async def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
                    counter.trip("PREPARE")
                    return await original(self, *args, **kwargs)

                return wrapped

            patch(AsyncAdapt_asyncpg_connection, "_start_transaction", begin)
            patch(AsyncAdapt_asyncpg_connection, "_call_and_discard", end)
            patch(asyncpg.connection.Connection, "prepare", prepare)
    except (ImportError, AttributeError) as error:  # pragma: no cover - driver drift
        print(f"  (round-trip counting unavailable: {error})")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


@contextmanager
def statement_counting(engine: AsyncEngine, on_statement: Callable[..., None]) -> Iterator[None]:
    """Call ``on_statement`` for every statement the engine sends, for the duration only.

    A ``before_cursor_execute`` listener alone would change what is measured: while
    the engine has one, the store sends SQLite step writes through SQLAlchemy (so
    that listeners see them) rather than straight to the driver. So the direct
    path is kept on here and counted where it runs.
    """
    from jobrun.sql.dialect import DirectSqliteStatement

    original_fetch = DirectSqliteStatement.fetch
    original_in_transaction = DirectSqliteStatement.fetch_in_transaction
    original_observed = DirectSqliteStatement.observed

    async def fetch(self: Any, connection: Any, values: Any) -> Any:
        on_statement(None, None, self._sql, values, None, False)
        return await original_fetch(self, connection, values)

    async def in_transaction(self: Any, connection: Any, values: Any, then: Any) -> Any:
        on_statement(None, None, self._sql, values, None, False)
        written = await original_in_transaction(self, connection, values, then)
        if written:
            on_statement(None, None, then._sql, values, None, False)
        return written

    # Patched for the counting phase only (mypy refuses method assignment), restored below.
    DirectSqliteStatement.fetch = fetch  # type: ignore[method-assign]
    DirectSqliteStatement.fetch_in_transaction = in_transaction  # type: ignore[method-assign]
    DirectSqliteStatement.observed = lambda self: False  # type: ignore[method-assign]
    event.listen(engine.sync_engine, "before_cursor_execute", on_statement)
    try:
        yield
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", on_statement)
        DirectSqliteStatement.fetch = original_fetch  # type: ignore[method-assign]
        DirectSqliteStatement.fetch_in_transaction = original_in_transaction  # type: ignore[method-assign]
        DirectSqliteStatement.observed = original_observed  # type: ignore[method-assign]


# --------------------------------------------------------------------------- backend


class Bench:
    """One backend: engine, store, jobs and the measurements taken on it."""

    def __init__(self, name: str, engine: AsyncEngine) -> None:
        self.name = name
        self.engine = engine
        self.is_postgres = engine.dialect.name == "postgresql"
        self.raw: Any = None  # the driver-level floor's own connection
        self.store = jobrun.SqlJobRunStore(engine)
        self.counter = Counter()
        self.counting_store = CountingStore(self.store, self.counter)
        self.registry = jobrun.JobRegistry()
        self.loop_marks: list[tuple[float, float, float]] = []
        self.failed_once: set[str] = set()
        self.serial = 0
        self.samples: dict[str, list[float]] = defaultdict(list)
        insert = (postgresql if self.is_postgres else sqlite).insert(scratch)
        self.upsert = insert.on_conflict_do_update(
            index_elements=[scratch.c.k], set_={"v": insert.excluded.v}
        )
        self.autocommit = (
            engine.execution_options(isolation_level="AUTOCOMMIT") if self.is_postgres else None
        )
        self._register()

        self.on_statement = lambda *_args: self.counter.statement()

    def _register(self) -> None:
        marks = self.loop_marks
        failed = self.failed_once

        async def steps(p: jobrun.JobPass) -> jobrun.PassResult:
            k = p.payload["k"]
            t0 = now_ms()
            await p.step("s0", lambda: 0)
            t1 = now_ms()
            for i in range(1, k):
                await p.step(f"s{i}", lambda i=i: i)
            marks.append((t0, t1, now_ms()))
            if p.payload.get("fail_once") and p.run.id not in failed:
                failed.add(p.run.id)
                raise RuntimeError("fail after the steps, so the next drive replays them")
            return jobrun.PassResult(done=True)

        async def advance(p: jobrun.JobPass) -> jobrun.PassResult:
            cursor = (p.cursor or 0) + 1
            return jobrun.PassResult(cursor=cursor, done=cursor >= p.payload["n"])

        no_wait = jobrun.RetryPolicy(max_attempts=5, base_delay_ms=0)
        self.registry.register(MODULE, "steps", steps, retry=no_wait)
        self.registry.register(MODULE, "advance", advance, retry=no_wait)

    async def prepare(self) -> None:
        await jobrun.upgrade(self.engine)
        async with self.engine.begin() as connection:
            await connection.run_sync(scratch_metadata.create_all)
            await connection.execute(delete(scratch))
            # Leftovers of an interrupted earlier run would be driven too.
            runs, steps = schema.job_runs, schema.job_steps
            ids = select(runs.c.id).where(runs.c.module_id == MODULE)
            await connection.execute(delete(steps).where(steps.c.run_id.in_(ids)))
            await connection.execute(delete(runs).where(runs.c.module_id == MODULE))
            # The row the two-statement floor updates.
            await connection.execute(self.upsert, {"k": "two-statement", "v": "0"})
        await self.open_raw()

    async def open_raw(self) -> None:
        """A bare driver connection (no SQLAlchemy, no pool) for the driver floor."""
        url = self.engine.url
        sql = "INSERT INTO bench_scratch (k, v) VALUES ({0}, {1}) "
        sql += "ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        if self.is_postgres:
            import asyncpg

            self.raw = await asyncpg.connect(
                host=url.host,
                port=url.port,
                user=url.username,
                password=url.password,
                database=url.database,
            )
            self.raw_sql = sql.format("$1", "$2")
        else:
            # The sqlite3 module itself, blocking, on the same file and settings.
            self.raw = sqlite3.connect(str(url.database))
            self.raw.execute("PRAGMA journal_mode = WAL")
            self.raw.execute("PRAGMA synchronous = NORMAL")
            self.raw_sql = sql.format("?", "?")

    async def close_raw(self) -> None:
        if self.raw is None:
            return
        if self.is_postgres:
            await self.raw.close()
        else:
            self.raw.close()
        self.raw = None

    async def start(self, job: str, payload: Any) -> str:
        self.serial += 1
        run = await jobrun.start_job_run(
            self.store, module_id=MODULE, job=job, instance=f"{job}-{self.serial}", payload=payload
        )
        return run.id

    async def drive(self, *, max_passes: int = 1, counted: bool = False) -> jobrun.JobDriveReport:
        store: Any = self.counting_store if counted else self.store
        return await jobrun.run_due_jobs(store, self.registry, max_passes=max_passes)

    # ----------------------------------------------------------------- floors

    async def floor_sample(self, n: int) -> None:
        for _ in range(n):
            self.serial += 1
            key = f"k{self.serial}"
            t0, c0 = now_ms(), cpu_ms()
            async with self.engine.begin() as connection:
                await connection.execute(self.upsert, {"k": key, "v": "x"})
            self.samples["floor_1row_ms"].append(now_ms() - t0)
            self.samples["floor_1row_cpu_ms"].append(cpu_ms() - c0)

            t0 = now_ms()
            if self.is_postgres:
                await self.raw.execute(self.raw_sql, key + "r", "x")
            else:
                with self.raw:  # commits
                    self.raw.execute(self.raw_sql, (key + "r", "x"))
            self.samples["floor_driver_1row_ms"].append(now_ms() - t0)

            if self.autocommit is not None:
                t0 = now_ms()
                async with self.autocommit.connect() as connection:
                    await connection.execute(self.upsert, {"k": key + "a", "v": "x"})
                self.samples["floor_1row_autocommit_ms"].append(now_ms() - t0)

            t0 = now_ms()
            async with self.engine.begin() as connection:
                await connection.execute(
                    update(scratch).where(scratch.c.k == "two-statement").values(v=key)
                )
                await connection.execute(delete(scratch).where(scratch.c.k == key))
            self.samples["floor_2stmt_ms"].append(now_ms() - t0)

            t0 = now_ms()
            async with self.engine.connect() as connection:
                (await connection.execute(select(scratch).where(scratch.c.k == key))).first()
            self.samples["floor_read_ms"].append(now_ms() - t0)

    # ----------------------------------------------------------------- steps

    async def steps_sample(self, k: int) -> None:
        await self.start("steps", {"k": k})
        t0, c0 = now_ms(), cpu_ms()
        report = await self.drive()
        elapsed = now_ms() - t0
        self.samples[f"steps{k}_cpu_ms"].append(cpu_ms() - c0)
        assert report.completed == 1, report
        start, first, end = self.loop_marks.pop()
        self.samples[f"steps{k}_drive_ms"].append(elapsed)
        self.samples[f"steps{k}_loop_ms"].append(end - start)
        self.samples[f"steps{k}_rest_ms"].append(end - first)

    async def replay_sample(self, k: int) -> None:
        await self.start("steps", {"k": k, "fail_once": True})
        t0 = now_ms()
        first = await self.drive()
        elapsed = now_ms() - t0
        assert first.retrying == 1, first
        self.loop_marks.pop()
        self.samples[f"failing{k}_drive_ms"].append(elapsed)
        t0, c0 = now_ms(), cpu_ms()
        second = await self.drive()
        elapsed = now_ms() - t0
        self.samples[f"replay{k}_cpu_ms"].append(cpu_ms() - c0)
        assert second.completed == 1, second
        start, first_mark, end = self.loop_marks.pop()
        self.samples[f"replay{k}_drive_ms"].append(elapsed)
        self.samples[f"replay{k}_loop_ms"].append(end - start)
        self.samples[f"replay{k}_rest_ms"].append(end - first_mark)

    async def passes_sample(self, passes: int) -> None:
        await self.start("advance", {"n": passes})
        t0, c0 = now_ms(), cpu_ms()
        report = await self.drive(max_passes=passes)
        elapsed = now_ms() - t0
        self.samples["passes_cpu_ms"].append(cpu_ms() - c0)
        assert (report.advanced, report.completed) == (passes - 1, 1), report
        self.samples["passes_drive_ms"].append(elapsed)

    # ----------------------------------------------------------------- counts

    async def count(self, k: int, passes: int) -> dict[str, Any]:
        counts: dict[str, Any] = {}
        dialect = "postgres" if self.is_postgres else "sqlite"
        with (
            statement_counting(self.engine, self.on_statement),
            driver_trip_counting(self.counter, dialect),
        ):
            self.counter.enabled = True
            try:
                await self.start("steps", {"k": k})
                self.counter.reset()
                await self.drive(counted=True)
                self.loop_marks.pop()
                counts["steps_pass"] = self.counter.snapshot()

                await self.start("steps", {"k": k, "fail_once": True})
                self.counter.reset()
                await self.drive(counted=True)
                self.loop_marks.pop()
                counts["failing_pass"] = self.counter.snapshot()
                self.counter.reset()
                await self.drive(counted=True)
                self.loop_marks.pop()
                counts["replay_pass"] = self.counter.snapshot()

                await self.start("advance", {"n": passes})
                self.counter.reset()
                await self.drive(max_passes=passes, counted=True)
                counts["multi_pass"] = self.counter.snapshot()

                self.counter.reset()
                async with self.engine.begin() as connection:
                    await connection.execute(self.upsert, {"k": "count", "v": "x"})
                counts["floor_1row"] = self.counter.snapshot()
            finally:
                self.counter.enabled = False
        if dialect == "postgres":
            # Statements are round trips too; the wrappers only saw the rest.
            for snapshot in counts.values():
                for op in snapshot["per_op"].values():
                    op["round_trips"] += op["statements"]
                snapshot["round_trip_kinds"]["statement"] = snapshot["total_statements"]
                snapshot["total_round_trips"] += snapshot["total_statements"]
        counts["k"] = k
        counts["passes"] = passes
        counts["summary"] = summarize_counts(counts, k, passes)
        return counts

    # ----------------------------------------------------------------- results

    def results(self, ks: list[int], passes: int) -> dict[str, Any]:
        s = self.samples
        floors = {name: rnd(median(s[name])) for name in FLOOR_NAMES if s.get(name)}
        floors["samples"] = len(s["floor_1row_ms"])
        floor = floors["floor_1row_ms"]
        floor_cpu = floors.get("floor_1row_cpu_ms")
        steps: dict[str, Any] = {}
        replay: dict[str, Any] = {}
        for k in ks:
            drive = median(s[f"steps{k}_drive_ms"])
            loop = median(s[f"steps{k}_loop_ms"])
            rest = median(s[f"steps{k}_rest_ms"])
            assert drive is not None
            assert loop is not None
            assert rest is not None
            per_step = drive / k
            cpu = median(s[f"steps{k}_cpu_ms"])
            assert cpu is not None
            marginal = rest / (k - 1) if k > 1 else loop
            steps[str(k)] = {
                "samples": len(s[f"steps{k}_drive_ms"]),
                "drive_ms": rnd(drive, 2),
                "ms_per_step": rnd(per_step),
                "ms_per_step_marginal": rnd(marginal),
                "fixed_ms_per_pass": rnd(drive - marginal * k, 2),
                "ratio_to_floor": rnd(per_step / floor if floor else None, 3),
                "cpu_ms_per_step": rnd(cpu / k),
                "cpu_ratio_to_floor_cpu": rnd(cpu / k / floor_cpu if floor_cpu else None, 3),
                "marginal_ratio_to_floor": rnd(marginal / floor if floor else None, 3),
            }
            autocommit = floors.get("floor_1row_autocommit_ms")
            if autocommit:
                steps[str(k)]["marginal_ratio_to_autocommit_floor"] = rnd(marginal / autocommit, 3)
            r_drive = median(s[f"replay{k}_drive_ms"])
            r_rest = median(s[f"replay{k}_rest_ms"])
            failing = median(s[f"failing{k}_drive_ms"])
            assert r_drive is not None
            assert r_rest is not None
            replay[str(k)] = {
                "samples": len(s[f"replay{k}_drive_ms"]),
                "failing_drive_ms": rnd(failing, 2),
                "replay_drive_ms": rnd(r_drive, 2),
                "ms_per_memo_hit": rnd(r_drive / k),
                "cpu_ms_per_memo_hit": rnd((median(s[f"replay{k}_cpu_ms"]) or 0) / k),
                "us_per_memo_hit_marginal": rnd(1000 * r_rest / (k - 1) if k > 1 else None, 2),
            }
        drive = median(s["passes_drive_ms"])
        assert drive is not None
        passes_result = {
            "samples": len(s["passes_drive_ms"]),
            "max_passes": passes,
            "drive_ms": rnd(drive, 2),
            "ms_per_pass": rnd(drive / passes),
            "passes_per_s": rnd(1000 * passes / drive, 1),
            "cpu_ms_per_pass": rnd((median(s["passes_cpu_ms"]) or 0) / passes),
            "ratio_to_2stmt_floor": rnd(
                drive / passes / floors["floor_2stmt_ms"] if floors.get("floor_2stmt_ms") else None,
                3,
            ),
        }
        return {
            "floors": floors,
            "steps": steps,
            "replay": replay,
            "passes": passes_result,
            "sample_stats_ms": {
                name: {
                    "n": len(values),
                    "median": rnd(median(values)),
                    "min": rnd(min(values)),
                    "max": rnd(max(values)),
                }
                for name, values in sorted(s.items())
            },
        }


def summarize_counts(counts: dict[str, Any], k: int, passes: int) -> dict[str, Any]:
    """Per-unit statement and round-trip counts from the counted scenarios."""

    def op(scenario: str, name: str, field: str) -> int:
        return int(counts[scenario]["per_op"].get(name, {}).get(field, 0))

    def calls(scenario: str, name: str) -> int:
        return max(1, op(scenario, name, "calls"))

    summary: dict[str, Any] = {}
    for field in ("statements", "round_trips"):
        steps_total = counts["steps_pass"][f"total_{field}"]
        replay_total = counts["replay_pass"][f"total_{field}"]
        overhead = sum(op("replay_pass", name, field) for name in ("claim", "steps", "commit_pass"))
        summary[field] = {
            "per_new_step": op("steps_pass", "record_step", field)
            / calls("steps_pass", "record_step"),
            "per_new_step_whole_pass": round(steps_total / k, 3),
            "per_memo_hit": (replay_total - overhead) / k,
            "per_pass_commit": op("steps_pass", "commit_pass", field)
            / calls("steps_pass", "commit_pass"),
            "per_failure_patch": op("failing_pass", "patch", field)
            / calls("failing_pass", "patch"),
            "per_claim": op("steps_pass", "claim", field) / max(1, calls("steps_pass", "claim")),
            "per_ledger_read": op("steps_pass", "steps", field) / calls("steps_pass", "steps"),
            "per_get": op("multi_pass", "get", field) / max(1, calls("multi_pass", "get")),
            "per_pass_in_multi_pass_drive": round(
                counts["multi_pass"][f"total_{field}"] / passes, 3
            ),
            "floor_1row": counts["floor_1row"][f"total_{field}"],
        }
    return summary


# --------------------------------------------------------------------------- setup


async def ensure_postgres_database(url: str) -> str:
    """Create the database named in ``url`` when missing; return the server version."""
    parsed = make_url(url)
    name = parsed.database
    admin = create_async_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            version = (await connection.exec_driver_sql("SHOW server_version")).scalar()
            exists = (
                await connection.exec_driver_sql(
                    "SELECT 1 FROM pg_database WHERE datname = $1", (name,)
                )
            ).first()
            if exists is None:
                quoted = name.replace('"', '""')
                await connection.exec_driver_sql(f'CREATE DATABASE "{quoted}"')
    finally:
        await admin.dispose()
    return str(version)


def machine_facts() -> dict[str, Any]:
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    import aiosqlite
    import asyncpg

    return {
        "nproc": os.cpu_count(),
        "memory_total": memory,
        "load_average_at_start": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "aiosqlite": getattr(aiosqlite, "__version__", None),
        "asyncpg": asyncpg.__version__,
        "jobrun": jobrun.__version__,
    }


# --------------------------------------------------------------------------- profile


async def profile_steps(bench: Bench, k: int, top: int) -> dict[str, Any]:
    """cProfile one pass of ``k`` new steps (event loop thread only)."""
    await bench.start("steps", {"k": k})
    profiler = cProfile.Profile()
    profiler.enable()
    await bench.drive()
    profiler.disable()
    bench.loop_marks.pop()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    entries: dict[str, list[dict[str, Any]]] = {}
    for key in ("cumulative", "tottime"):
        stats.sort_stats(key)
        rows = []
        # fcn_list and stats are pstats.Stats attributes that typeshed does not declare.
        for func in stats.fcn_list[:top]:  # type: ignore[attr-defined]
            _cc, nc, tt, ct, _callers = stats.stats[func]  # type: ignore[attr-defined]
            filename, line, name = func
            rows.append(
                {
                    "function": f"{filename}:{line}({name})",
                    "ncalls": nc,
                    "tottime_ms": round(tt * 1000, 2),
                    "cumtime_ms": round(ct * 1000, 2),
                }
            )
        entries[key] = rows
    return {"k": k, **entries}


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (small K, 1 round)")
    parser.add_argument("--repeat", type=int, default=None, help="rounds (default 5; quick 1)")
    parser.add_argument("--sqlite-only", action="store_true", help="skip Postgres")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--k", type=int, action="append", help="steps per pass (repeatable)")
    parser.add_argument("--passes", type=int, default=None, help="max_passes (default 1000)")
    parser.add_argument("--floor-n", type=int, default=None, help="floor transactions per round")
    parser.add_argument(
        "--sqlite-no-reset",
        action="store_true",
        help="add a SQLite engine made with pool_reset_on_return=None (experiment)",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="K", help="cProfile K steps")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/)")
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 5)
    args.k = sorted(set(args.k or ([20] if args.quick else [100, 1000])))
    args.passes = args.passes or (20 if args.quick else 1000)
    args.floor_n = args.floor_n or (20 if args.quick else 200)
    if min(args.k) < 2 or args.passes < 2 or args.repeat < 1 or args.floor_n < 1:
        parser.error("--k and --passes must be at least 2; --repeat, --floor-n at least 1")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    meta = machine_facts()
    meta["date"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    script = Path(sys.argv[0]).name
    meta["command"] = " ".join([".venv/bin/python", f"benchmarks/{script}", *sys.argv[1:]])
    meta["params"] = {
        "repeat": args.repeat,
        "k": args.k,
        "passes": args.passes,
        "floor_n": args.floor_n,
        "quick": args.quick,
    }
    meta["load_1min_by_round"] = []
    benches: list[Bench] = []
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
        sqlite_engine = create_async_engine(f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        benches.append(Bench("sqlite", sqlite_engine))
        if args.sqlite_no_reset:
            no_reset = create_async_engine(
                f"sqlite+aiosqlite:///{Path(tmp) / 'bench-nr.db'}", pool_reset_on_return=None
            )
            benches.append(Bench("sqlite-nr", no_reset))
        if not args.sqlite_only:
            meta["postgres"] = await ensure_postgres_database(args.postgres_url)
            meta["postgres_url"] = make_url(args.postgres_url).render_as_string()
            benches.append(Bench("postgres", create_async_engine(args.postgres_url)))
        try:
            for bench in benches:
                await bench.prepare()
                # Warm-up: schema check, compiled-statement and prepared-statement caches.
                await bench.floor_sample(5)
                await bench.steps_sample(min(args.k))
                await bench.replay_sample(min(args.k))
                await bench.passes_sample(5)
                bench.samples.clear()
            kinds: list[tuple[str, Callable[[Bench], Awaitable[None]]]] = [
                ("floors", lambda b: b.floor_sample(args.floor_n)),
                *[(f"steps K={k}", lambda b, k=k: b.steps_sample(k)) for k in args.k],
                *[(f"replay K={k}", lambda b, k=k: b.replay_sample(k)) for k in args.k],
                ("passes", lambda b: b.passes_sample(args.passes)),
            ]
            for round_number in range(args.repeat):
                order = benches if round_number % 2 == 0 else benches[::-1]
                load = os.getloadavg()[0]
                meta["load_1min_by_round"].append(round(load, 2))
                print(f"round {round_number + 1}/{args.repeat} (load {load:.2f})", flush=True)
                for kind, sample in kinds:
                    for bench in order:
                        t0 = time.perf_counter()
                        await sample(bench)
                        took = time.perf_counter() - t0
                        print(f"  {bench.name:8} {kind:14} {took:7.2f} s", flush=True)
                    order = order[::-1]
            backends: dict[str, Any] = {}
            count_k = min([*args.k, 100])
            count_passes = min(args.passes, 50)
            for bench in benches:
                result = bench.results(args.k, args.passes)
                result["counts"] = await bench.count(count_k, count_passes)
                backends[bench.name] = result
            if args.profile:
                backends["sqlite"]["profile"] = await profile_steps(benches[0], args.profile, 12)
        finally:
            for bench in benches:
                await bench.close_raw()
                await bench.engine.dispose()
    meta["load_average_at_end"] = os.getloadavg()
    return {"meta": meta, "backends": backends}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)


def table(results: dict[str, Any]) -> str:
    backends = results["backends"]
    names = list(backends)
    rows: list[tuple[str, list[Any]]] = []

    def row(label: str, get: Callable[[dict[str, Any]], Any]) -> None:
        values = []
        for name in names:
            try:
                values.append(get(backends[name]))
            except (KeyError, TypeError):
                values.append(None)
        rows.append((label, values))

    row("floor: 1-row upsert txn, engine.begin() (ms)", lambda b: b["floors"]["floor_1row_ms"])
    row("floor: 1-row upsert txn, CPU (ms)", lambda b: b["floors"]["floor_1row_cpu_ms"])
    row("floor: 1-row upsert, autocommit (ms)", lambda b: b["floors"]["floor_1row_autocommit_ms"])
    row("floor: 1-row upsert, bare driver (ms)", lambda b: b["floors"]["floor_driver_1row_ms"])
    row("floor: UPDATE+DELETE txn (ms)", lambda b: b["floors"]["floor_2stmt_ms"])
    row("floor: 1-row read, engine.connect() (ms)", lambda b: b["floors"]["floor_read_ms"])
    ks = list(next(iter(backends.values()))["steps"])
    for k in ks:
        row(f"K={k}: pass drive (ms)", lambda b, k=k: b["steps"][k]["drive_ms"])
        row(f"K={k}: ms/step (whole drive / K)", lambda b, k=k: b["steps"][k]["ms_per_step"])
        row(f"K={k}:   ratio to 1-row floor", lambda b, k=k: b["steps"][k]["ratio_to_floor"])
        row(f"K={k}: CPU ms/step", lambda b, k=k: b["steps"][k]["cpu_ms_per_step"])
        row(
            f"K={k}:   CPU ratio to 1-row floor CPU",
            lambda b, k=k: b["steps"][k]["cpu_ratio_to_floor_cpu"],
        )
        row(
            f"K={k}: ms/step marginal (steps 2..K)",
            lambda b, k=k: b["steps"][k]["ms_per_step_marginal"],
        )
        row(
            f"K={k}:   marginal ratio to 1-row floor",
            lambda b, k=k: b["steps"][k]["marginal_ratio_to_floor"],
        )
        row(
            f"K={k}:   marginal ratio to autocommit floor",
            lambda b, k=k: b["steps"][k]["marginal_ratio_to_autocommit_floor"],
        )
        row(f"K={k}: fixed cost per pass (ms)", lambda b, k=k: b["steps"][k]["fixed_ms_per_pass"])
        row(f"K={k}: replay drive (ms)", lambda b, k=k: b["replay"][k]["replay_drive_ms"])
        row(
            f"K={k}: ms/memo hit (replay drive / K)",
            lambda b, k=k: b["replay"][k]["ms_per_memo_hit"],
        )
        row(
            f"K={k}: µs/memo hit marginal (hits 2..K)",
            lambda b, k=k: b["replay"][k]["us_per_memo_hit_marginal"],
        )
    row("passes: ms/pass (commit + get)", lambda b: b["passes"]["ms_per_pass"])
    row("passes: pass commits/s", lambda b: b["passes"]["passes_per_s"])
    row("passes: CPU ms/pass", lambda b: b["passes"]["cpu_ms_per_pass"])
    row("passes: ratio to UPDATE+DELETE floor", lambda b: b["passes"]["ratio_to_2stmt_floor"])
    for field, label in (("statements", "stmts"), ("round_trips", "round trips")):

        def summary(b: dict[str, Any], f: str = field) -> Any:
            return b["counts"]["summary"][f]

        row(f"{label} per new step", lambda b, s=summary: s(b)["per_new_step"])
        row(
            f"{label} per new step (whole pass)",
            lambda b, s=summary: s(b)["per_new_step_whole_pass"],
        )
        row(f"{label} per memo hit", lambda b, s=summary: s(b)["per_memo_hit"])
        row(f"{label} per pass commit", lambda b, s=summary: s(b)["per_pass_commit"])
        row(f"{label} per claim", lambda b, s=summary: s(b)["per_claim"])
        row(f"{label} per ledger read", lambda b, s=summary: s(b)["per_ledger_read"])
        row(f"{label} per get (between passes)", lambda b, s=summary: s(b)["per_get"])
        row(
            f"{label} per pass, max_passes drive",
            lambda b, s=summary: s(b)["per_pass_in_multi_pass_drive"],
        )
        row(f"{label} of the 1-row floor txn", lambda b, s=summary: s(b)["floor_1row"])
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{'':{width}}" + "".join(f"{name:>12}" for name in names)]
    lines.append("-" * len(lines[0]))
    for label, values in rows:
        if all(value is None for value in values):
            continue
        lines.append(f"{label:{width}}" + "".join(f"{fmt(v):>12}" for v in values))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print()
    print(table(results))
    profile = results["backends"].get("sqlite", {}).get("profile")
    if profile:
        print(f"\ncProfile, SQLite, one pass of {profile['k']} new steps (event-loop thread):")
        for key in ("cumulative", "tottime"):
            print(f"  top by {key}:")
            for entry in profile[key]:
                print(
                    f"    {entry['cumtime_ms']:9.1f} cum {entry['tottime_ms']:9.1f} tot "
                    f"{entry['ncalls']:>7}  {entry['function']}"
                )
    out = args.out
    if out is None:
        date = dt.date.today().isoformat()
        suffix = "-quick" if args.quick else ""
        out = ROOT / "benchmarks" / "results" / f"core-{date}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(out)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
