"""jobrun benchmark suite: walks, starts, drives, resume, idle and a comparison with DBOS.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_jobrun.py steps      # floors + steps + memo hits (bench_core)
    .venv/bin/python benchmarks/bench_jobrun.py passes     # commits/s + the 100,000-object walk
    .venv/bin/python benchmarks/bench_jobrun.py start      # start new vs join, 50 racing starters
    .venv/bin/python benchmarks/bench_jobrun.py drive      # 1,000 due runs; claim with 1M finished
    .venv/bin/python benchmarks/bench_jobrun.py resume     # killed pass -> next new step
    .venv/bin/python benchmarks/bench_jobrun.py vs-dbos    # the same step loop on DBOS Transact
    .venv/bin/python benchmarks/bench_jobrun.py idle       # statements while nobody drives
    .venv/bin/python benchmarks/bench_jobrun.py all        # every one of the above, in order

Common options: ``--quick`` (a smoke run), ``--sqlite-only``, ``--postgres-url``,
``--repeat N``, ``--out-dir DIR``. Each command prints a table and writes
``<out-dir>/<command>-<date>[-quick].json`` with the command line, machine facts
and the load average in it. Ratios are always taken between numbers measured in
the same process run, interleaved, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for entry in (str(ROOT), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench_core import ensure_postgres_database, machine_facts, statement_counting  # noqa: E402
from sqlalchemy import delete, func, insert, make_url, select, text, update  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

import jobrun  # noqa: E402
from jobrun.sql.schema import job_runs, job_steps  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_bench"
MODULE = "bench"
NO_WAIT = jobrun.RetryPolicy(max_attempts=1000, base_delay_ms=0)


# --------------------------------------------------------------------------- helpers


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rnd(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def rss_mb() -> float:
    """Current resident set size (not the peak), from /proc."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Backend:
    """One database: engine, store and a registry the commands fill in."""

    def __init__(self, name: str, engine: AsyncEngine) -> None:
        self.name = name
        self.engine = engine
        self.is_postgres = engine.dialect.name == "postgresql"
        self.store = jobrun.SqlJobRunStore(engine)
        self.registry = jobrun.JobRegistry()
        self.serial = 0
        self.statements = 0
        self.statement_log: list[tuple[str, Any]] = []
        self.keep_log = False

        def on_statement(_c: Any, _cur: Any, statement: str, params: Any, *_a: Any) -> None:
            self.statements += 1
            if self.keep_log:
                self.statement_log.append((statement, params))

        self.on_statement = on_statement

    def counting(self) -> Any:
        """Count statements while in this block (listeners off elsewhere: see bench_core)."""
        return statement_counting(self.engine, self.on_statement)

    async def prepare(self, module: str = MODULE) -> None:
        await jobrun.upgrade(self.engine)
        async with self.engine.begin() as connection:
            ids = select(job_runs.c.id).where(job_runs.c.module_id == module)
            await connection.execute(delete(job_steps).where(job_steps.c.run_id.in_(ids)))
            await connection.execute(delete(job_runs).where(job_runs.c.module_id == module))

    async def start(self, job: str, payload: Any = None, instance: str | None = None) -> str:
        self.serial += 1
        run = await jobrun.start_job_run(
            self.store,
            module_id=MODULE,
            job=job,
            instance=instance if instance is not None else f"{job}-{self.serial}",
            payload=payload,
        )
        return run.id

    async def drive(self, **kwargs: Any) -> jobrun.JobDriveReport:
        return await jobrun.run_due_jobs(self.store, self.registry, **kwargs)

    async def ledger_size(self, run_id: str) -> int:
        async with self.engine.connect() as connection:
            query = select(func.count()).select_from(job_steps)
            return int(
                (await connection.execute(query.where(job_steps.c.run_id == run_id))).scalar_one()
            )


async def open_backends(args: argparse.Namespace, tmp: Path, tag: str) -> list[Backend]:
    backends = [Backend("sqlite", create_async_engine(f"sqlite+aiosqlite:///{tmp / tag}.db"))]
    if not args.sqlite_only:
        await ensure_postgres_database(args.postgres_url)
        backends.append(Backend("postgres", create_async_engine(args.postgres_url)))
    for backend in backends:
        await backend.prepare()
    return backends


async def close_backends(backends: list[Backend]) -> None:
    for backend in backends:
        await backend.engine.dispose()


def interleaved(backends: list[Backend], round_number: int) -> list[Backend]:
    return backends if round_number % 2 == 0 else backends[::-1]


def meta_for(args: argparse.Namespace) -> dict[str, Any]:
    meta = machine_facts()
    meta["date"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["command"] = " ".join([".venv/bin/python", "benchmarks/bench_jobrun.py", *sys.argv[1:]])
    meta["load_average_at_start"] = os.getloadavg()
    return meta


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)


def print_table(title: str, columns: list[str], rows: list[tuple[str, list[Any]]]) -> None:
    width = max([len(label) for label, _ in rows] + [10]) + 2
    print(f"\n== {title}")
    print(f"{'':{width}}" + "".join(f"{name:>14}" for name in columns))
    for label, values in rows:
        print(f"{label:{width}}" + "".join(f"{fmt(v):>14}" for v in values))


def write_json(args: argparse.Namespace, command: str, results: dict[str, Any]) -> Path:
    results["meta"]["load_average_at_end"] = os.getloadavg()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    date = dt.date.today().isoformat()
    path = out_dir / f"{command}-{date}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    print(f"\nwrote {path}")
    return path


# --------------------------------------------------------------------------- steps


def cmd_steps(args: argparse.Namespace) -> int:
    """Floors, steps (K = 100, 1,000), memo hits and counts: ``bench_core.py``."""
    import bench_core

    argv: list[str] = []
    if args.quick:
        argv += ["--quick", "--k", "5", "--passes", "5", "--floor-n", "3"]
    if args.sqlite_only:
        argv.append("--sqlite-only")
    if args.repeat:
        argv += ["--repeat", str(args.repeat)]
    argv += ["--postgres-url", args.postgres_url]
    date = dt.date.today().isoformat()
    argv += [
        "--out",
        str(Path(args.out_dir) / f"steps-{date}{'-quick' if args.quick else ''}.json"),
    ]
    if args.profile:
        argv += ["--profile", str(args.profile)]
    return bench_core.main(argv)


# --------------------------------------------------------------------------- passes


def register_walk(
    backend: Backend, chunk: int, total: int, per: str, sizes: list[int], job: str
) -> None:
    """A walk over ``total`` objects, ``chunk`` per pass, one step per object or per page."""

    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        start = p.cursor or 0
        end = min(start + chunk, total)
        if per == "object":
            for i in range(start, end):
                await p.step(f"o{i}", lambda i=i: {"id": i, "ok": True})
        else:
            await p.step(f"page{start}", lambda: {"from": start, "to": end, "ok": True})
        p.count("objects", end - start)
        if p.payload.get("measure_ledger"):
            sizes.append(await backend.ledger_size(p.run.id))
        return jobrun.PassResult(cursor=end, done=end >= total)

    backend.registry.register(MODULE, job, walk, retry=NO_WAIT)


async def walk_one(args: argparse.Namespace) -> dict[str, Any]:
    """One walk in this (fresh) process: wall time, objects/s, RSS."""
    with tempfile.TemporaryDirectory(prefix="jobrun-walk-") as tmp:
        url = (
            args.postgres_url
            if args.walk_backend == "postgres"
            else f"sqlite+aiosqlite:///{Path(tmp) / 'walk.db'}"
        )
        if args.walk_backend == "postgres":
            await ensure_postgres_database(url)
        backend = Backend(args.walk_backend, create_async_engine(url))
        try:
            await backend.prepare()
            sizes: list[int] = []
            total, chunk, per = args.objects, args.chunk, args.per
            register_walk(backend, chunk, total, per, sizes, "walk")
            # Warm up caches on a tiny walk of the same job, then measure the real one.
            rss_marks: dict[int, float] = {}
            await backend.start("walk", {"measure_ledger": False})
            await backend.drive(max_passes=1)
            await backend.prepare()
            run_id = await backend.start("walk", {"measure_ledger": False})
            passes_per_mark = max(1, 10_000 // chunk)
            gc.collect()
            rss_start = rss_mb()
            t0 = now_ms()
            done = 0
            while True:
                report = await backend.drive(max_passes=passes_per_mark)
                assert report.attempted == 1, report
                assert not report.errors, report
                row = await jobrun.get_job_run(backend.store, run_id)
                assert row is not None
                done = row.cursor or 0
                rss_marks[done] = rss_mb()
                if row.status != "running":
                    break
            wall_ms = now_ms() - t0
            assert done == total, done
            # The ledger: measured on a second, shorter walk with a count after every pass
            # (kept out of the timed walk, since the count is a query of its own).
            ledger_objects = min(total, chunk * 20)
            register_walk(backend, chunk, ledger_objects, per, sizes, "walk-ledger")
            await backend.start("walk-ledger", {"measure_ledger": True})
            await backend.drive(max_passes=ledger_objects // chunk + 1)
            first = rss_marks.get(10_000) or next(iter(rss_marks.values()))
            return {
                "backend": args.walk_backend,
                "objects": total,
                "chunk": chunk,
                "per": per,
                "passes": -(-total // chunk),
                "steps": total if per == "object" else -(-total // chunk),
                "wall_s": rnd(wall_ms / 1000, 3),
                "objects_per_s": rnd(total / (wall_ms / 1000), 1),
                "ms_per_step": rnd(wall_ms / (total if per == "object" else -(-total // chunk))),
                "rss_start_mb": rnd(rss_start, 1),
                "rss_at_10000_mb": rnd(first, 1),
                "rss_at_end_mb": rnd(rss_marks[total], 1),
                "rss_growth_10k_to_end_mb": rnd(rss_marks[total] - first, 2),
                "peak_rss_mb": rnd(peak_rss_mb(), 1),
                "largest_ledger_rows": max(sizes) if sizes else None,
                "steps_per_pass": chunk if per == "object" else 1,
                "rss_marks_mb": {str(k): rnd(v, 1) for k, v in rss_marks.items()},
            }
        finally:
            await backend.engine.dispose()


async def commits_per_second(backends: list[Backend], passes: int, repeat: int) -> dict[str, Any]:
    async def advance(p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = (p.cursor or 0) + 1
        return jobrun.PassResult(cursor=cursor, done=cursor >= p.payload["n"])

    for backend in backends:
        backend.registry.register(MODULE, "advance", advance, retry=NO_WAIT)
        await backend.start("advance", {"n": 5})
        await backend.drive(max_passes=5)
    samples: dict[str, list[float]] = {b.name: [] for b in backends}
    statements: dict[str, float] = {}
    for round_number in range(repeat):
        for backend in interleaved(backends, round_number):
            await backend.start("advance", {"n": passes})
            t0 = now_ms()
            report = await backend.drive(max_passes=passes)
            elapsed = now_ms() - t0
            assert report.completed == 1, report
            samples[backend.name].append(passes / (elapsed / 1000))
    for backend in backends:
        # Counted apart from the timed drives (a listener costs time of its own).
        counted = 50
        await backend.start("advance", {"n": counted})
        before = backend.statements
        with backend.counting():
            await backend.drive(max_passes=counted)
        statements[backend.name] = (backend.statements - before) / counted
    return {
        name: {
            "passes_per_drive": passes,
            "pass_commits_per_s": rnd(median(values), 1),
            "samples": [rnd(v, 1) for v in values],
            "statements_per_pass": rnd(statements[name], 3),
        }
        for name, values in samples.items()
    }


def cmd_passes(args: argparse.Namespace) -> int:
    if args.walk_backend:
        print(json.dumps(asyncio.run(walk_one(args))))
        return 0
    meta = meta_for(args)
    objects = 2_000 if args.quick else args.objects
    chunks = [100] if args.quick else [100, 1000]
    pers = ["object"] if args.quick else args.per_modes
    names = ["sqlite"] + ([] if args.sqlite_only else ["postgres"])

    async def commits() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
            backends = await open_backends(args, Path(tmp), "passes")
            try:
                return await commits_per_second(
                    backends, 20 if args.quick else 1000, 1 if args.quick else args.repeat or 3
                )
            finally:
                await close_backends(backends)

    results: dict[str, Any] = {"meta": meta, "commits": asyncio.run(commits()), "walks": []}
    # Each walk in a fresh process, so that its peak RSS is its own.
    for per in pers:
        for chunk in chunks:
            for name in names:
                command = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "passes",
                    "--walk-backend",
                    name,
                    "--objects",
                    str(objects),
                    "--chunk",
                    str(chunk),
                    "--per",
                    per,
                    "--postgres-url",
                    args.postgres_url,
                ]
                print(f"walk: {name} chunk={chunk} per={per} objects={objects}", flush=True)
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(done.stdout + done.stderr)
                results["walks"].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print_table(
        "pass commits (no steps, max_passes drive)",
        list(results["commits"]),
        [
            ("pass commits/s", [v["pass_commits_per_s"] for v in results["commits"].values()]),
            (
                "statements per pass",
                [v["statements_per_pass"] for v in results["commits"].values()],
            ),
        ],
    )
    walks = results["walks"]
    print_table(
        f"walk of {objects:,} objects",
        [f"{w['backend'][:2]}/{w['chunk']}/{w['per'][:3]}" for w in walks],
        [
            ("steps", [w["steps"] for w in walks]),
            ("wall (s)", [w["wall_s"] for w in walks]),
            ("objects/s", [w["objects_per_s"] for w in walks]),
            ("ms per step", [w["ms_per_step"] for w in walks]),
            ("peak RSS (MB)", [w["peak_rss_mb"] for w in walks]),
            ("RSS growth 10k->end (MB)", [w["rss_growth_10k_to_end_mb"] for w in walks]),
            ("largest ledger (rows)", [w["largest_ledger_rows"] for w in walks]),
            ("steps per pass", [w["steps_per_pass"] for w in walks]),
        ],
    )
    write_json(args, "passes", results)
    return 0


# --------------------------------------------------------------------------- start


async def start_bench(args: argparse.Namespace) -> dict[str, Any]:
    repeat = 5 if args.quick else args.repeat or 200
    racers = 10 if args.quick else 50
    race_rounds = 2 if args.quick else 20
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
        backends = await open_backends(args, Path(tmp), "start")
        try:
            for backend in backends:
                await backend.start("idle", instance="warm")
                await backend.start("idle", instance="warm")
            new: dict[str, list[float]] = {b.name: [] for b in backends}
            join: dict[str, list[float]] = {b.name: [] for b in backends}
            race: dict[str, list[float]] = {b.name: [] for b in backends}
            created_ok: dict[str, bool] = {b.name: True for b in backends}
            stmts: dict[str, dict[str, float]] = {b.name: {} for b in backends}
            for round_number in range(repeat):
                for backend in interleaved(backends, round_number):
                    key = f"k{round_number}"
                    t0 = now_ms()
                    await backend.start("idle", instance=key)
                    new[backend.name].append(now_ms() - t0)
                    t0 = now_ms()
                    await backend.start("idle", instance=key)
                    join[backend.name].append(now_ms() - t0)
            for backend in backends:
                with backend.counting():
                    before = backend.statements
                    await backend.start("idle", instance="counted")
                    stmts[backend.name]["new"] = backend.statements - before
                    before = backend.statements
                    await backend.start("idle", instance="counted")
                    stmts[backend.name]["join"] = backend.statements - before
            for round_number in range(race_rounds):
                for backend in interleaved(backends, round_number):
                    key = f"race{round_number}"
                    t0 = now_ms()
                    ids = await asyncio.gather(
                        *(backend.start("idle", instance=key) for _ in range(racers))
                    )
                    race[backend.name].append(now_ms() - t0)
                    created_ok[backend.name] &= len(set(ids)) == 1
            for backend in backends:
                name = backend.name
                out[name] = {
                    "new_ms": rnd(median(new[name])),
                    "join_ms": rnd(median(join[name])),
                    "join_over_new": ratio(median(join[name]), median(new[name])),
                    "statements_new": stmts[name]["new"],
                    "statements_join": stmts[name]["join"],
                    "racers": racers,
                    "race_wall_ms": rnd(median(race[name]), 2),
                    "race_ms_per_starter": rnd((median(race[name]) or 0) / racers),
                    "race_one_run_per_key": created_ok[name],
                    "samples": repeat,
                    "race_rounds": race_rounds,
                }
        finally:
            await close_backends(backends)
    return out


def cmd_start(args: argparse.Namespace) -> int:
    results = {"meta": meta_for(args), "backends": asyncio.run(start_bench(args))}
    b = results["backends"]
    print_table(
        "start_job_run",
        list(b),
        [
            ("new (ms)", [v["new_ms"] for v in b.values()]),
            ("join (ms)", [v["join_ms"] for v in b.values()]),
            ("join / new", [v["join_over_new"] for v in b.values()]),
            (
                "statements new / join",
                [f"{v['statements_new']}/{v['statements_join']}" for v in b.values()],
            ),
            ("racers on one key", [v["racers"] for v in b.values()]),
            ("race wall (ms)", [v["race_wall_ms"] for v in b.values()]),
            ("race ms per starter", [v["race_ms_per_starter"] for v in b.values()]),
            ("one run per key", [v["race_one_run_per_key"] for v in b.values()]),
        ],
    )
    write_json(args, "start", results)
    return 0


# --------------------------------------------------------------------------- drive


def finished_rows(module: str, count: int, offset: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(offset, offset + count):
        at = f"2020-01-{1 + i % 28:02d}T00:00:{i % 60:02d}.000Z"
        rows.append(
            {
                "id": f"h{i:09d}",
                "module_id": module,
                "job": "old",
                "instance": f"i{i}",
                "payload": "null",
                "status": "done" if i % 10 else "failed",
                "cursor": None,
                "counters": "{}",
                "attempts": 0,
                "last_error": None,
                "started_at": at,
                "updated_at": at,
                "next_attempt_at": None,
                "ended_at": at,
                "lease_owner": None,
                "lease_driver": None,
                "lease_began_at": None,
                "lease_takeovers": 0,
            }
        )
    return rows


async def fill_history(backend: Backend, count: int) -> float:
    """Insert ``count`` finished runs (kept across runs of the benchmark); seconds taken."""
    async with backend.engine.connect() as connection:
        have = (
            await connection.execute(
                select(func.count()).select_from(job_runs).where(job_runs.c.module_id == "history")
            )
        ).scalar_one()
    if have == count:
        return 0.0
    t0 = time.perf_counter()
    async with backend.engine.begin() as connection:
        await connection.execute(delete(job_runs).where(job_runs.c.module_id == "history"))
    batch = 20_000
    for offset in range(0, count, batch):
        rows = finished_rows("history", min(batch, count - offset), offset)
        async with backend.engine.begin() as connection:
            if backend.is_postgres:
                raw = await connection.get_raw_connection()
                columns = list(rows[0])
                await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
                    job_runs.name,
                    records=[tuple(r[c] for c in columns) for r in rows],
                    columns=columns,
                )
            else:
                await connection.execute(insert(job_runs), rows)
    async with backend.engine.begin() as connection:
        await connection.execute(text("ANALYZE"))
    return time.perf_counter() - t0


async def explain_claim(backend: Backend, job: str = "due") -> list[str]:
    """The plan of the claim exactly as the store sends it (callers undo the lease it takes)."""
    backend.statement_log.clear()
    backend.keep_log = True
    try:
        with backend.counting():
            await backend.store.claim(jobrun_claim_request("explain", job))
    finally:
        backend.keep_log = False
    statement, params = next(
        (s, p) for s, p in backend.statement_log if s.lstrip().upper().startswith("UPDATE")
    )
    async with backend.engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        if backend.is_postgres:
            rows = await driver.fetch("EXPLAIN " + statement, *params)  # type: ignore[union-attr]
            plan = [r[0] for r in rows]
        else:
            cursor = await driver.execute("EXPLAIN QUERY PLAN " + statement, params)  # type: ignore[union-attr]
            plan = [" ".join(str(c) for c in r) for r in await cursor.fetchall()]
            await cursor.close()
        await connection.rollback()
    return plan


def jobrun_claim_request(token: str, job: str = "due") -> Any:
    from jobrun._core.formats import format_instant
    from jobrun._core.records import ClaimRequest
    from jobrun._system import system_clock

    now_at = format_instant(system_clock())
    expires = "9999-01-01T00:00:00.000Z"
    return ClaimRequest(now_at, token, "bench", {(MODULE, job): expires}, frozenset())


async def reset_due(backend: Backend) -> None:
    async with backend.engine.begin() as connection:
        await connection.execute(
            update(job_runs)
            .where(job_runs.c.module_id == MODULE, job_runs.c.job == "due")
            .values(next_attempt_at=None, lease_owner=None, lease_driver=None, lease_began_at=None)
        )


async def drive_bench(args: argparse.Namespace) -> dict[str, Any]:
    due_runs = 100 if args.quick else 1000
    history = 20_000 if args.quick else args.history
    claims = 20 if args.quick else 200
    repeat = 1 if args.quick else args.repeat or 5
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
        empty = await open_backends(args, Path(tmp), "drive-empty")
        # The filled databases are kept between runs (filling Postgres takes a while).
        filled_args = argparse.Namespace(**vars(args))
        filled_args.postgres_url = str(
            make_url(args.postgres_url).set(database="jobrun_bench_history")
        )
        keep = Path(tempfile.gettempdir()) / "jobrun-bench-history"
        keep.mkdir(exist_ok=True)
        filled = await open_backends(filled_args, keep, f"history-{history}")
        try:
            fill_s: dict[str, float] = {}
            for backend in filled:
                fill_s[backend.name] = await fill_history(backend, history)
            for backend in [*empty, *filled]:

                async def trivial(_p: jobrun.JobPass) -> jobrun.PassResult:
                    return jobrun.PassResult(done=True)

                async def due(_p: jobrun.JobPass) -> jobrun.PassResult:
                    return jobrun.PassResult()

                backend.registry.register(MODULE, "trivial", trivial, retry=NO_WAIT)
                backend.registry.register(MODULE, "due", due, retry=NO_WAIT)
            # 1) run_due_jobs over 1,000 due runs with limit 50 (empty history).
            drive_ms: dict[str, float] = {}
            drive_calls: dict[str, int] = {}
            plans_many_due: dict[str, list[str]] = {}
            for backend in empty:
                for i in range(due_runs):
                    await backend.start("trivial", None, instance=f"t{i}")
                # The claim's plan with `due_runs` live runs due (it leases one of them).
                plan_due = await explain_claim(backend, "trivial")
                async with backend.engine.begin() as connection:
                    await connection.execute(
                        update(job_runs)
                        .where(job_runs.c.module_id == MODULE)
                        .values(next_attempt_at=None, lease_owner=None, lease_driver=None)
                    )
                plans_many_due[backend.name] = plan_due
                t0 = now_ms()
                calls = 0
                total = 0
                while True:
                    report = await backend.drive(limit=50)
                    calls += 1
                    total += report.completed
                    if report.attempted == 0:
                        break
                drive_ms[backend.name] = now_ms() - t0
                drive_calls[backend.name] = calls
                assert total == due_runs, total
            # 2) claim cost: none vs `history` finished runs, interleaved.
            plans: dict[str, dict[str, list[str]]] = {}
            for backend in [*empty, *filled]:
                for i in range(50):
                    await backend.start("due", None, instance=f"d{i}")
                plans.setdefault(backend.name, {})[
                    "empty" if backend in empty else "history"
                ] = await explain_claim(backend)
                await reset_due(backend)
            claim: dict[tuple[str, str], list[float]] = {}
            idle_claim: dict[tuple[str, str], list[float]] = {}
            pairs = [(b, "empty") for b in empty] + [(b, "history") for b in filled]
            for round_number in range(repeat):
                order = pairs if round_number % 2 == 0 else pairs[::-1]
                for backend, kind in order:
                    samples = claim.setdefault((backend.name, kind), [])
                    for i in range(claims):
                        t0 = now_ms()
                        row = await backend.store.claim(jobrun_claim_request(f"c{i}"))
                        samples.append(now_ms() - t0)
                        if row is None:
                            await reset_due(backend)
                    await reset_due(backend)
                    # Nothing due: the poll an idle worker pays.
                    async with backend.engine.begin() as connection:
                        await connection.execute(
                            update(job_runs)
                            .where(job_runs.c.module_id == MODULE, job_runs.c.job == "due")
                            .values(next_attempt_at="9999-01-01T00:00:00.000Z")
                        )
                    idle = idle_claim.setdefault((backend.name, kind), [])
                    for i in range(claims):
                        t0 = now_ms()
                        row = await backend.store.claim(jobrun_claim_request(f"i{i}"))
                        idle.append(now_ms() - t0)
                        assert row is None
                    await reset_due(backend)
            for backend in empty:
                name = backend.name
                e, h = median(claim[(name, "empty")]), median(claim[(name, "history")])
                ie, ih = median(idle_claim[(name, "empty")]), median(idle_claim[(name, "history")])
                plan_h = plans[name]["history"]
                out[name] = {
                    "due_runs": due_runs,
                    "drive_total_ms": rnd(drive_ms[name], 1),
                    "drive_ms_per_run": rnd(drive_ms[name] / due_runs),
                    "drive_calls": drive_calls[name],
                    "finished_runs_retained": history,
                    "history_fill_s": rnd(fill_s[name], 1),
                    "claim_ms_empty": rnd(e),
                    "claim_ms_history": rnd(h),
                    "claim_ratio": ratio(h, e),
                    "idle_claim_ms_empty": rnd(ie),
                    "idle_claim_ms_history": rnd(ih),
                    "idle_claim_ratio": ratio(ih, ie),
                    "plan_empty": plans[name]["empty"],
                    "plan_with_many_due": plans_many_due[name],
                    "plan_with_many_due_uses_due_index": any(
                        "_substrat_job_runs_claim_order" in p for p in plans_many_due[name]
                    ),
                    "plan_history": plan_h,
                    "plan_uses_due_index": any(
                        "_substrat_job_runs_claim_order" in p for p in plan_h
                    ),
                    "plan_has_seq_scan": any(
                        ("Seq Scan" in p and "_substrat_job_runs" in p)
                        or (p.split(" ", 3)[-1].startswith("SCAN _substrat_job_runs"))
                        for p in plan_h
                    ),
                    "claims_per_sample": claims,
                    "rounds": repeat,
                }
        finally:
            await close_backends(empty)
            await close_backends(filled)
    return out


def cmd_drive(args: argparse.Namespace) -> int:
    results = {"meta": meta_for(args), "backends": asyncio.run(drive_bench(args))}
    b = results["backends"]
    print_table(
        "drive and claim",
        list(b),
        [
            ("due runs drained (limit 50)", [v["due_runs"] for v in b.values()]),
            ("drain total (ms)", [v["drive_total_ms"] for v in b.values()]),
            ("ms per run", [v["drive_ms_per_run"] for v in b.values()]),
            ("run_due_jobs calls", [v["drive_calls"] for v in b.values()]),
            ("finished runs retained", [v["finished_runs_retained"] for v in b.values()]),
            ("claim (ms), empty", [v["claim_ms_empty"] for v in b.values()]),
            ("claim (ms), history", [v["claim_ms_history"] for v in b.values()]),
            ("claim ratio history/empty", [v["claim_ratio"] for v in b.values()]),
            ("nothing-due claim (ms), empty", [v["idle_claim_ms_empty"] for v in b.values()]),
            ("nothing-due claim (ms), history", [v["idle_claim_ms_history"] for v in b.values()]),
            ("nothing-due ratio", [v["idle_claim_ratio"] for v in b.values()]),
            ("plan uses due index", [v["plan_uses_due_index"] for v in b.values()]),
            ("plan has a seq scan of runs", [v["plan_has_seq_scan"] for v in b.values()]),
            (
                "plan uses due index, many due",
                [v["plan_with_many_due_uses_due_index"] for v in b.values()],
            ),
        ],
    )
    for name, v in b.items():
        print(f"\n{name} claim plan with history:\n  " + "\n  ".join(v["plan_history"]))
        print(f"{name} claim plan, many due:\n  " + "\n  ".join(v["plan_with_many_due"]))
    write_json(args, "drive", results)
    return 0


# --------------------------------------------------------------------------- resume


def register_resume(backend: Backend, marks: dict[str, float]) -> None:
    """Warm up to pass ``warm``, then a pass of ``n`` steps that dies before step n+1;
    the next pass replays n steps and times its first new one."""

    async def resumable(p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = p.cursor or 0
        if cursor < p.payload["warm"]:
            return jobrun.PassResult(cursor=cursor + 1)
        n = p.payload["n"]
        for i in range(n):
            await p.step(f"s{i}", lambda i=i: i)

        def first_new() -> int:
            marks.setdefault("first_new", now_ms())
            return n

        if "killed" not in marks:
            marks["killed"] = now_ms()
            if p.payload.get("cancel"):
                raise asyncio.CancelledError
            raise RuntimeError("killed after n steps")
        await p.step(f"s{n}", first_new)
        return jobrun.PassResult(done=True)

    backend.registry.register(MODULE, "resumable", resumable, retry=NO_WAIT)


async def resume_sample(backend: Backend, warm: int, n: int, cancel: bool) -> float:
    marks: dict[str, float] = backend.registry_marks  # type: ignore[attr-defined]
    marks.clear()
    await backend.start("resumable", {"warm": warm, "n": n, "cancel": cancel})
    if warm:
        report = await backend.drive(max_passes=warm)
        assert report.advanced == warm, report
    if cancel:
        with contextlib.suppress(asyncio.CancelledError):
            await backend.drive()
    else:
        report = await backend.drive()
        assert report.retrying == 1, report
    report = await backend.drive()
    assert report.completed == 1, report
    return marks["first_new"] - marks["killed"]


async def resume_bench(args: argparse.Namespace) -> dict[str, Any]:
    warms = [0, 20] if args.quick else [0, 999]
    n = 10 if args.quick else 100
    repeat = 1 if args.quick else args.repeat or 7
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
        backends = await open_backends(args, Path(tmp), "resume")
        try:
            for backend in backends:
                backend.registry_marks = {}  # type: ignore[attr-defined]
                register_resume(backend, backend.registry_marks)  # type: ignore[attr-defined]
                await resume_sample(backend, 2, n, False)
            samples: dict[tuple[str, int, str], list[float]] = {}
            for round_number in range(repeat):
                for backend in interleaved(backends, round_number):
                    for warm in warms:
                        for mode in ("fail", "cancel"):
                            value = await resume_sample(backend, warm, n, mode == "cancel")
                            samples.setdefault((backend.name, warm, mode), []).append(value)
            for backend in backends:
                entry: dict[str, Any] = {"steps_before_kill": n, "rounds": repeat}
                for mode in ("fail", "cancel"):
                    first = median(samples[(backend.name, warms[0], mode)])
                    last = median(samples[(backend.name, warms[1], mode)])
                    entry[mode] = {
                        f"pass_{warms[0] + 1}_ms": rnd(first),
                        f"pass_{warms[1] + 1}_ms": rnd(last),
                        "ratio": ratio(last, first),
                    }
                out[backend.name] = entry
        finally:
            await close_backends(backends)
    return {"passes": [w + 1 for w in warms], "backends": out}


def cmd_resume(args: argparse.Namespace) -> int:
    data = asyncio.run(resume_bench(args))
    results = {"meta": meta_for(args), **data}
    b = data["backends"]
    first, last = data["passes"]
    rows: list[tuple[str, list[Any]]] = []
    for mode, label in (("fail", "pass raised"), ("cancel", "task cancelled")):
        rows.append(
            (
                f"{label}: run at pass {first} (ms)",
                [v[mode][f"pass_{first}_ms"] for v in b.values()],
            )
        )
        rows.append(
            (f"{label}: run at pass {last} (ms)", [v[mode][f"pass_{last}_ms"] for v in b.values()])
        )
        rows.append((f"{label}: ratio", [v[mode]["ratio"] for v in b.values()]))
    print_table(
        f"resume: kill after {next(iter(b.values()))['steps_before_kill']} steps -> first new step",
        list(b),
        rows,
    )
    write_json(args, "resume", results)
    return 0


# --------------------------------------------------------------------------- idle


async def idle_bench(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 0.3 if args.quick else 1.0
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="jobrun-bench-") as tmp:
        backends = await open_backends(args, Path(tmp), "idle")
        try:
            for backend in backends:

                async def one(p: jobrun.JobPass) -> jobrun.PassResult:
                    await p.step("a", lambda: 1)
                    return jobrun.PassResult(cursor=1)

                backend.registry.register(MODULE, "one", one, retry=NO_WAIT)
                # Leave a live, due run behind: there is work, but nobody calls the driver.
                await backend.start("one")
                await backend.drive()
                tasks_before = len(asyncio.all_tasks())
                before = backend.statements
                with backend.counting():
                    await asyncio.sleep(seconds)
                out[backend.name] = {
                    "idle_seconds": seconds,
                    "statements": backend.statements - before,
                    "background_tasks": tasks_before - 1,
                    "live_runs_left_due": 1,
                }
        finally:
            await close_backends(backends)
    return out


def cmd_idle(args: argparse.Namespace) -> int:
    results = {"meta": meta_for(args), "backends": asyncio.run(idle_bench(args))}
    b = results["backends"]
    print_table(
        "idle",
        list(b),
        [
            ("idle seconds", [v["idle_seconds"] for v in b.values()]),
            ("statements while idle", [v["statements"] for v in b.values()]),
            ("background tasks left", [v["background_tasks"] for v in b.values()]),
        ],
    )
    write_json(args, "idle", results)
    return 0


# --------------------------------------------------------------------------- A/B


async def ab_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Each optimisation idea as a variant engine/store, measured interleaved in one run."""
    k = 20 if args.quick else 200
    passes = 20 if args.quick else 200
    repeat = 1 if args.quick else args.repeat or 7
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="jobrun-ab-") as tmp:
        variants: list[Backend] = []

        def sqlite(name: str, direct: bool, **kwargs: Any) -> None:
            url = f"sqlite+aiosqlite:///{Path(tmp) / name}.db"
            backend = Backend(name, create_async_engine(url, **kwargs))
            if not direct:
                backend.store._direct = None  # the SQLAlchemy path, as before the change
            variants.append(backend)

        sqlite("sqlite: direct driver path (kept)", True)
        sqlite("sqlite: SQLAlchemy txn (before)", False)
        sqlite("sqlite: SQLAlchemy txn, no pool reset", False, pool_reset_on_return=None)
        sqlite("sqlite: direct + pool_pre_ping", True, pool_pre_ping=True)
        if not args.sqlite_only:
            await ensure_postgres_database(args.postgres_url)
            url = args.postgres_url
            variants.append(Backend("postgres: default", create_async_engine(url)))
            variants.append(
                Backend(
                    "postgres: no prepared-stmt cache",
                    create_async_engine(url, connect_args={"prepared_statement_cache_size": 0}),
                )
            )
            variants.append(
                Backend("postgres: pool_pre_ping", create_async_engine(url, pool_pre_ping=True))
            )

        async def steps(p: jobrun.JobPass) -> jobrun.PassResult:
            for i in range(p.payload["k"]):
                await p.step(f"s{i}", lambda i=i: i)
            return jobrun.PassResult(done=True)

        async def advance(p: jobrun.JobPass) -> jobrun.PassResult:
            cursor = (p.cursor or 0) + 1
            return jobrun.PassResult(cursor=cursor, done=cursor >= p.payload["n"])

        try:
            for backend in variants:
                await backend.prepare()
                backend.registry.register(MODULE, "steps", steps, retry=NO_WAIT)
                backend.registry.register(MODULE, "advance", advance, retry=NO_WAIT)
                await backend.start("steps", {"k": 5})
                await backend.drive()
            step_ms: dict[str, list[float]] = {b.name: [] for b in variants}
            step_cpu: dict[str, list[float]] = {b.name: [] for b in variants}
            commit_ps: dict[str, list[float]] = {b.name: [] for b in variants}
            for round_number in range(repeat):
                for backend in interleaved(variants, round_number):
                    await backend.start("steps", {"k": k})
                    t0, c0 = now_ms(), time.process_time_ns() / 1e6
                    report = await backend.drive()
                    step_ms[backend.name].append((now_ms() - t0) / k)
                    step_cpu[backend.name].append((time.process_time_ns() / 1e6 - c0) / k)
                    assert report.completed == 1, report
                    await backend.start("advance", {"n": passes})
                    t0 = now_ms()
                    report = await backend.drive(max_passes=passes)
                    commit_ps[backend.name].append(passes / ((now_ms() - t0) / 1000))
                    assert report.completed == 1, report
            for backend in variants:
                out[backend.name] = {
                    "ms_per_step": rnd(median(step_ms[backend.name])),
                    "cpu_ms_per_step": rnd(median(step_cpu[backend.name])),
                    "pass_commits_per_s": rnd(median(commit_ps[backend.name]), 1),
                    "k": k,
                    "passes": passes,
                    "rounds": repeat,
                }
        finally:
            await close_backends(variants)
    return out


def cmd_ab(args: argparse.Namespace) -> int:
    results = {"meta": meta_for(args), "variants": asyncio.run(ab_bench(args))}
    v = results["variants"]
    print_table(
        "optimisation A/B (interleaved, one run)",
        ["ms/step", "CPU ms/step", "commits/s"],
        [
            (name, [x["ms_per_step"], x["cpu_ms_per_step"], x["pass_commits_per_s"]])
            for name, x in v.items()
        ],
    )
    write_json(args, "ab", results)
    return 0


# --------------------------------------------------------------------------- vs DBOS


def cmd_vs_dbos(args: argparse.Namespace) -> int:
    import bench_dbos

    return bench_dbos.main(args)


# --------------------------------------------------------------------------- main

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "steps": cmd_steps,
    "passes": cmd_passes,
    "start": cmd_start,
    "drive": cmd_drive,
    "resume": cmd_resume,
    "idle": cmd_idle,
    "ab": cmd_ab,
    "vs-dbos": cmd_vs_dbos,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=[*COMMANDS, "all"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--out-dir", default=str(HERE / "results"))
    parser.add_argument("--profile", type=int, default=0, help="steps: cProfile K SQLite steps")
    parser.add_argument("--objects", type=int, default=100_000, help="passes: walk length")
    parser.add_argument(
        "--per-modes",
        nargs="+",
        default=["object"],
        choices=["object", "page"],
        help="passes: one step per object and/or per page",
    )
    parser.add_argument("--history", type=int, default=1_000_000, help="drive: finished runs")
    parser.add_argument("--k", type=int, default=None, help="vs-dbos: steps per workflow")
    parser.add_argument("--recovery-steps", type=int, default=3000, help="vs-dbos")
    # Internal: one walk / one DBOS backend in a child process.
    parser.add_argument("--walk-backend", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--per", default="object", help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "all":
        for name, command in COMMANDS.items():
            print(f"\n######## {name}", flush=True)
            code = command(args)
            if code:
                return code
        return 0
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
