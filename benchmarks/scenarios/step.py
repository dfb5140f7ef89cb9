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
  handler over N new steps (the pass's claim and commit are outside the timing);
* jobrun whole pass: the same pass of N new steps timed around ``run_due_jobs``, so
  the claim, the first step's ledger read and the commit that drops the ledger are
  in it, per step (issue 32 item 5's measurement).

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

from sqlalchemy import event, text

import jobrun
from benchmarks import harness
from benchmarks.harness.floors import (
    SCRATCH,
    UPSERT,
    Raw,
    held_run,
    like_the_floor,
    step_statement,
)

ROW = ["r", "", '"x"', 1, None, "2026-01-01T00:00:00.000Z"]


def raw_upsert(raw: Raw, n: int) -> harness.Sample:
    upsert, row = UPSERT.format(raw.marks(6)), list(ROW)

    async def sample() -> float:
        started = time.perf_counter()
        for _ in range(n):
            row[1] = uuid.uuid4().hex
            await raw.execute(upsert, row)
        return harness.timed_ms(started, n)

    return sample


def fenced(raw: Raw, engine: Any, held: tuple[str, str], n: int, lock: bool) -> harness.Sample:
    sql, arguments, step_at = step_statement(engine, held)
    if not lock:
        sql = sql.replace(" FOR SHARE", "")

    async def sample() -> float:
        started = time.perf_counter()
        for _ in range(n):
            name = uuid.uuid4().hex
            for at in step_at:
                arguments[at] = name
            await raw.execute(sql, arguments)
        return harness.timed_ms(started, n)

    return sample


def sqlalchemy_floor(engine: Any, n: int) -> harness.Sample:
    statement, row = text(UPSERT.format(", ".join(f":v{i}" for i in range(6)))), list(ROW)

    async def sample() -> float:
        started = time.perf_counter()
        for _ in range(n):
            row[1] = uuid.uuid4().hex
            async with engine.begin() as connection:
                await connection.execute(statement, {f"v{i}": row[i] for i in range(6)})
        return harness.timed_ms(started, n)

    return sample


def one_of_each(raw: Raw, fence_raw: Raw, engine: Any, held: tuple[str, str]) -> dict[str, Any]:
    """One operation of each raw floor, for the paired measurement."""
    upsert, row = UPSERT.format(raw.marks(6)), list(ROW)
    sql, arguments, step_at = step_statement(engine, held)

    def one_upsert() -> Any:
        row[1] = uuid.uuid4().hex
        return raw.execute(upsert, row)

    def one_fenced() -> Any:
        name = uuid.uuid4().hex
        for at in step_at:
            arguments[at] = name
        return fence_raw.execute(sql, arguments)

    return {"raw": one_upsert, "raw + fence": one_fenced}


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
            engines.append(await args.databases.engine(backend))
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
        event.listen(floor_engine.sync_engine, "connect", like_the_floor)
    async with floor_engine.begin() as connection:
        await connection.execute(text(SCRATCH))
    chosen = {
        "raw driver": raw_upsert(raw, n),
        "raw driver + fence": fenced(fence_raw, fence_engine, held, n, lock=True),
    }
    if backend == "postgres":
        no_lock = fenced(fence_raw, fence_engine, held, n, lock=False)
        chosen["raw driver + fence, no FOR SHARE"] = no_lock
    chosen["SQLAlchemy floor"] = sqlalchemy_floor(floor_engine, n)

    async def close() -> None:
        await raw.connection.close()
        await fence_raw.connection.close()

    await own_engine()  # the jobrun step's file
    return chosen, close, one_of_each(raw, fence_raw, fence_engine, held)


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


class _Answering:
    """Stands for a driver connection: every statement answered at once (one row; applied)."""

    async def fetch(self, *_arguments: Any) -> list[tuple[None]]:
        # Postgres's step write returns the run's pause: NULL, not paused.
        return [(None,)]

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
    report = await jobrun.run_due_jobs(store, registry, limit=1)
    assert report.completed == 1, report
    return harness.spread(per_step)


async def measure(backend: str, args: Any) -> dict[str, Any]:
    engines = [await args.databases.engine(backend)]
    n = 20 if args.quick else args.n
    chosen, close, floors = await variants(backend, args, engines, n)
    # Last engine made: the jobrun store's own file on SQLite.
    store = jobrun.SqlJobRunStore(engines[-1])
    chosen["jobrun step"] = harness.step_runner(store, n)
    chosen["jobrun whole pass"] = harness.whole_pass_runner(store, n)
    samples = await harness.interleave_samples(chosen, args.rounds or (2 if args.quick else 15))
    found: dict[str, Any] = {name: statistics.median(values) for name, values in samples.items()}
    found["spread"] = {name: harness.spread(values) for name, values in samples.items()}
    ours = samples["jobrun step"]
    found["ratios"] = {
        "jobrun step / raw driver": harness.round_ratios(ours, samples["raw driver"]),
        "jobrun step / raw driver + fence": harness.round_ratios(
            ours, samples["raw driver + fence"]
        ),
        "jobrun whole pass / raw driver": harness.round_ratios(
            samples["jobrun whole pass"], samples["raw driver"]
        ),
        "raw driver + fence / raw driver": harness.round_ratios(
            samples["raw driver + fence"], samples["raw driver"]
        ),
    }
    found["python"] = await python_only(store, n * 10, 3 if args.quick else 9)
    found["python, record result"] = await python_only(
        store, n * 10, 3 if args.quick else 9, a_record
    )
    found["paired"] = await paired(store, floors, n * 10)
    if args.profile:
        runner = harness.step_runner(store, n * 10)
        found["profile"] = await harness.profiled(f"{backend}: {n * 10} new steps", runner)
    await close()
    for engine in engines:
        await engine.dispose()
    return found


def dbos_child(backend: str, args: Any) -> dict[str, Any]:
    """DBOS runs one global instance per process: each dialect in its own child."""
    command = [sys.executable, "-m", "benchmarks.processes.dbos_steps", backend]
    command += ["--n", str(20 if args.quick else args.n), "--postgres-url", args.postgres_url]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=harness.child_environment(),
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def scenario(args: Any) -> None:
    results: dict[str, Any] = {}
    for backend in harness.backends(args):
        results[backend] = await measure(backend, args)
        if args.dbos and importlib.util.find_spec("dbos") is not None:
            results[backend]["dbos"] = dbos_child(backend, args)
    for backend in harness.backends(args):
        dbos = results[backend].get("dbos")
        if dbos and "dbos_ms_per_step" in dbos:
            print(
                f"{backend}: DBOS {dbos['dbos_ms_per_step']:.3f} ms/step, jobrun in the same "
                f"child {dbos['jobrun_ms_per_step']:.3f} ({dbos['dbos_over_jobrun']:.1f}x)"
            )
    print_tables(args, results)
    harness.save(args, results)


def print_tables(args: Any, results: dict[str, Any]) -> None:
    chosen = harness.backends(args)
    names = list(results[chosen[-1]]["spread"])
    rows = []
    for name in names:
        cells = [name]
        for backend in chosen:
            found = results[backend]["spread"].get(name)
            cells.append("–" if found is None else harness.shown(found))
        rows.append(cells)
    for name in results[chosen[0]]["ratios"]:
        rows.append(
            [f"**{name}**", *(harness.shown(results[b]["ratios"][name], 2, "x") for b in chosen)]
        )
    rows.append(
        ["jobrun's Python per step, driver answering at once, µs"]
        + [harness.shown(results[backend]["python"], 1) for backend in chosen]
    )
    rows.append(
        ["the same, the step returning a small record (dict), µs"]
        + [harness.shown(results[backend]["python, record result"], 1) for backend in chosen]
    )
    harness.table(
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
    harness.table(
        "paired inside one pass, µs per operation (each step next to one raw upsert and "
        "one raw fenced statement)",
        ["", "", "raw driver", "raw + fence", "jobrun step", "/ raw", "/ raw + fence"],
        pairs,
    )


if __name__ == "__main__":
    harness.run(scenario, n=200, dbos=False)
