"""A new step against the floors: the raw driver's durable one-row upsert, and SQLAlchemy's.

Per dialect, interleaved in one process, each sample N operations, ms per operation:

* raw driver: a one-row ``INSERT ... ON CONFLICT DO UPDATE`` into a table shaped
  like the step ledger, on one driver connection in autocommit (aiosqlite with
  WAL and ``synchronous=NORMAL``; asyncpg), so durable when it returns;
* raw driver + fence: jobrun's own step statement, the exact text the store
  sends (the upsert guarded by the ``EXISTS`` on the held run, ``FOR SHARE`` on
  Postgres) with the same parameters, on a connection alike; and on Postgres
  the same without ``FOR SHARE``, to price the lock;
* SQLAlchemy floor: the raw upsert inside ``engine.begin()``;
* jobrun step: ``await p.step(name, fn)`` with a trivial body, timed inside the
  handler over N new steps (the pass's claim and commit are outside the timing).

Each figure is the median of the interleaved samples with its interquartile
range; a ratio is the median of per-round ratios (the two samples of one round
were taken side by side) with theirs. Then, outside the interleaving: jobrun's
own Python per step with the store's driver call answered at once (event-loop
CPU, no I/O), and the paired measurement.

On SQLite each variant writes its own database file (all configured alike), so
each pays the WAL checkpoints its own commits cause; the harness collects garbage
before every sample, so no variant pays for another's. Both were needed for
stable ratios: see the README.

``--dbos`` adds DBOS Transact (the ``bench`` extra) in a child process per dialect:
a workflow of N trivial ``@DBOS.step`` calls against a jobrun pass of N steps.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import uuid
from functools import partial
from typing import Any

from harness import (
    backends,
    driver_dsn,
    fresh_engine,
    interleave_samples,
    main,
    options,
    profiled,
    round_ratios,
    save,
    shown,
    spread,
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
        # Executed and fetched (jobrun's step write returns a row on Postgres; on
        # SQLite it returns none and jobrun reads the change count instead).
        if self.backend == "sqlite":
            await self.connection.execute_fetchall(sql, values)
        else:
            await self.connection.fetch(sql, *values)

    def marks(self, count: int) -> str:
        if self.backend == "sqlite":
            return ", ".join("?" * count)
        return ", ".join(f"${n}" for n in range(1, count + 1))


def _like_the_floor(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 30000"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


async def variants(
    backend: str, args: Any, engines: list[Any], n: int
) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """The floors, each on its own database (``own_engine``) when that is a SQLite file;
    how to close them; and one operation of each raw floor, for the paired measurement."""

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
    held = await held_run(fence_engine)
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
        sql, arguments, step_at = step_statement(fence_engine, held)
        if not lock:
            sql = sql.replace(" FOR SHARE", "")

        async def sample() -> float:
            started = time.perf_counter()
            for _ in range(n):
                name = uuid.uuid4().hex
                for at in step_at:
                    arguments[at] = name
                await fence_raw.execute(sql, arguments)
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

    sql, arguments, step_at = step_statement(fence_engine, held)

    def one_upsert() -> Any:
        row[1] = uuid.uuid4().hex
        return raw.execute(upsert, row)

    def one_fenced() -> Any:
        name = uuid.uuid4().hex
        for at in step_at:
            arguments[at] = name
        return fence_raw.execute(sql, arguments)

    await own_engine()  # the jobrun step's file
    return chosen, close, {"raw": one_upsert, "raw + fence": one_fenced}


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


async def paired(store: jobrun.SqlJobRunStore, floors: dict[str, Any], n: int) -> dict[str, float]:
    """Each new step next to one raw upsert and one raw fenced statement (order
    rotating) inside one pass, timed one by one: all meet the same moment of a noisy
    machine. Microseconds per operation: wall median and mean, and the event loop
    thread's own CPU (mean)."""
    sides = [*floors, "jobrun"]
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu = dict.fromkeys(sides, 0.0)

    async def one(side: str, operation: Any) -> None:
        started, used = time.perf_counter(), time.thread_time()
        await operation
        wall[side].append((time.perf_counter() - started) * 1e6)
        cpu[side] += (time.thread_time() - used) * 1e6

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(n):
            turn = index % len(sides)
            for side in sides[turn:] + sides[:turn]:
                if side == "jobrun":
                    await one(side, p.step(f"s{index}", lambda: 1))
                else:
                    await one(side, floors[side]())
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register("bench", "paired", handler)
    await jobrun.start_job_run(store, module_id="bench", job="paired", instance=uuid.uuid4().hex)
    gc.collect()
    assert (await jobrun.run_due_jobs(store, registry, limit=1)).completed == 1
    found: dict[str, float] = {}
    for side in sides:
        found[f"{side} median"] = round(statistics.median(wall[side]), 1)
        found[f"{side} mean"] = round(statistics.mean(wall[side]), 1)
        found[f"{side} loop cpu"] = round(cpu[side] / n, 1)
    return found


async def held_run(engine: Any) -> tuple[str, str]:
    """A running run leased to a token of its own, for the fenced raw statements
    (of a job no benchmark registers, so no driver claims it)."""
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(
        store, module_id="bench", job="held", instance=uuid.uuid4().hex
    )
    token = uuid.uuid4().hex
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE _substrat_job_runs SET lease_owner = :token WHERE id = :id"),
            {"id": run.id, "token": token},
        )
    return run.id, token


def step_statement(engine: Any, held: tuple[str, str]) -> tuple[str, list[Any], tuple[int, ...]]:
    """The exact SQL text jobrun's store sends for a new step, its parameter list
    (built as the store builds it) and where the step's name sits in that list
    (twice on SQLite, whose statement reads the run again while it is paused)."""
    prepared = jobrun.SqlJobRunStore(engine)._statements.record_step
    name = object()
    values = {
        "fence_id": held[0],
        "fence_token": held[1],
        "step_run_id": held[0],
        "step_step": name,
        "step_result": "1",
        "step_attempts": 1,
        "step_last_error": None,
        "step_recorded_at": "2026-01-01T00:00:00.000Z",
    }
    arguments = prepared.arguments(values)
    return prepared.sql, arguments, tuple(at for at, value in enumerate(arguments) if value is name)


class _Answering:
    """Stands for a driver connection: every statement answered at once (one row; applied)."""

    async def fetch(self, *_arguments: Any) -> list[tuple[int]]:
        return [(1,)]

    async def execute_fetchall(self, *_arguments: Any) -> list[tuple[int]]:
        return [(1,)]

    async def execute(self, *_arguments: Any) -> _Applied:
        return _APPLIED

    def is_closed(self) -> bool:
        return False


class _Applied:
    """aiosqlite's cursor after a write that changed one row (SQLite's step write)."""

    rowcount = 1


_APPLIED = _Applied()


def a_record(index: int) -> dict[str, Any]:
    """A typical step result that is not a scalar: a small record, as an API gives."""
    return {
        "id": index,
        "name": f"object {index}",
        "state": "ready",
        "tags": ["alpha", "beta"],
        "size": 12_345,
        "ok": True,
        "parent": None,
        "links": {"self": f"/objects/{index}", "owner": "/users/7"},
    }


async def python_only(
    store: jobrun.SqlJobRunStore, n: int, rounds: int, body: Any = None
) -> dict[str, float]:
    """jobrun's own Python per new step, µs of event-loop CPU: the store's driver
    connection (aiosqlite's, or the kept asyncpg ones) swapped for one that answers
    at once, so no I/O and no other thread; everything above the driver runs as in
    a real step."""
    executor: Any = store._executor
    per_step: list[float] = []

    def swap(drivers: list[Any] | None) -> list[Any]:
        """Put ``drivers`` in (the answering one when ``None``); the ones taken out."""
        if store._is_postgres:
            idle = executor._connections()._idle
            taken = [kept.driver for kept in idle]
            for index, kept in enumerate(idle):
                kept.driver = _Answering() if drivers is None else drivers[index]
            return taken
        taken = [executor._connection.driver]
        executor._connection.driver = _Answering() if drivers is None else drivers[0]
        return taken

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", lambda: 0)  # the pass's ledger read and connection, for real
        real = swap(None)
        try:
            for round_number in range(rounds):
                gc.collect()
                used = time.thread_time()
                for index in range(n):
                    fn = (lambda index=index: index) if body is None else partial(body, index)
                    await p.step(f"r{round_number}-{index}", fn)
                per_step.append((time.thread_time() - used) * 1e6 / n)
        finally:
            swap(real)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register("bench", "python", handler)
    await jobrun.start_job_run(store, module_id="bench", job="python", instance=uuid.uuid4().hex)
    assert (await jobrun.run_due_jobs(store, registry, limit=1)).completed == 1
    return spread(per_step)


async def measure(backend: str, args: Any) -> dict[str, Any]:
    engines = [await fresh_engine(backend, args)]
    n = 20 if args.quick else args.n
    chosen, close, floors = await variants(backend, args, engines, n)
    # Last engine made: the jobrun store's own file on SQLite.
    store = jobrun.SqlJobRunStore(engines[-1])
    chosen["jobrun step"] = step_runner(store, n)
    samples = await interleave_samples(chosen, args.rounds or (2 if args.quick else 15))
    found: dict[str, Any] = {name: statistics.median(values) for name, values in samples.items()}
    found["spread"] = {name: spread(values) for name, values in samples.items()}
    ours = samples["jobrun step"]
    found["ratios"] = {
        "jobrun step / raw driver": round_ratios(ours, samples["raw driver"]),
        "jobrun step / raw driver + fence": round_ratios(ours, samples["raw driver + fence"]),
        "raw driver + fence / raw driver": round_ratios(
            samples["raw driver + fence"], samples["raw driver"]
        ),
    }
    found["python"] = await python_only(store, n * 10, 3 if args.quick else 9)
    found["python, record result"] = await python_only(
        store, n * 10, 3 if args.quick else 9, a_record
    )
    found["paired"] = await paired(store, floors, n * 10)
    if args.profile:
        runner = step_runner(store, n * 10)
        found["profile"] = await profiled(f"{backend}: {n * 10} new steps", runner)
    await close()
    for engine in engines:
        await engine.dispose()
    return found


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
    for backend in backends(args):
        dbos = results[backend].get("dbos")
        if dbos and "dbos_ms_per_step" in dbos:
            print(
                f"{backend}: DBOS {dbos['dbos_ms_per_step']:.3f} ms/step, jobrun in the same "
                f"child {dbos['jobrun_ms_per_step']:.3f} ({dbos['dbos_over_jobrun']:.1f}x)"
            )
    print_tables(args, results)
    save(args, "step", results)


def print_tables(args: Any, results: dict[str, Any]) -> None:
    chosen = backends(args)
    names = list(results[chosen[-1]]["spread"])
    rows = []
    for name in names:
        cells = [name]
        for backend in chosen:
            found = results[backend]["spread"].get(name)
            cells.append("–" if found is None else shown(found))
        rows.append(cells)
    for name in results[chosen[0]]["ratios"]:
        rows.append([f"**{name}**", *(shown(results[b]["ratios"][name], 2, "x") for b in chosen)])
    rows.append(
        ["jobrun's Python per step, driver answering at once, µs"]
        + [shown(results[backend]["python"], 1) for backend in chosen]
    )
    rows.append(
        ["the same, the step returning a small record (dict), µs"]
        + [shown(results[backend]["python, record result"], 1) for backend in chosen]
    )
    table(
        "ms per durable one-row write: median [interquartile range] of interleaved samples; "
        "ratios: median [IQR] of per-round ratios",
        ["", *chosen],
        rows,
    )
    pairs = []
    for backend in chosen:
        found = results[backend]["paired"]
        for measure_name in ("median", "mean", "loop cpu"):
            floor, fenced = found[f"raw {measure_name}"], found[f"raw + fence {measure_name}"]
            ours = found[f"jobrun {measure_name}"]
            ratios = [f"{ours / floor:.2f}x", f"{ours / fenced:.2f}x"]
            pairs.append([backend, measure_name, floor, fenced, ours, *ratios])
    table(
        "paired inside one pass, µs per operation (each step next to one raw upsert and "
        "one raw fenced statement)",
        ["", "", "raw driver", "raw + fence", "jobrun step", "/ raw", "/ raw + fence"],
        pairs,
    )


if __name__ == "__main__":
    main(scenario, options(__doc__ or "", n=200, dbos=False))
