"""jobrun next to DBOS Transact: the same trivial step loop, and recovery after a kill.

Called as ``bench_jobrun.py vs-dbos`` (needs the ``bench`` extra: ``pip install -e
'.[bench]'``). DBOS keeps one global instance per process, bound to one system
database, so each backend runs in its own child process; inside it, jobrun and
DBOS alternate sample by sample on the same kind of database, and the ratio is
taken there.

* steps: one workflow / one pass of K trivial steps (``return i``), ms per step.
  DBOS: ``@DBOS.workflow`` calling an async ``@DBOS.step`` K times. jobrun: one
  pass of ``await p.step(...)`` through ``run_due_jobs``.
* recovery: a workflow (a pass) of R steps is killed after its R-th step
  (DBOS: the child process calls ``os._exit`` inside step R+1; jobrun: the pass
  raises after step R, as a crashed pass leaves its ledger). Then the time from
  the start of recovery (DBOS: ``DBOS._recover_pending_workflows`` for the dead
  executor, in a fresh process; jobrun: the next ``run_due_jobs``) to the first
  NEW step's body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from sqlalchemy import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402

import jobrun  # noqa: E402


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6


def dbos_url(backend: str, tmp: Path, postgres_url: str, name: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / name}.sqlite"
    return (
        make_url(postgres_url)
        .set(drivername="postgresql", database=name)
        .render_as_string(hide_password=False)
    )


def reset_postgres(postgres_url: str, name: str) -> None:
    import psycopg

    admin = make_url(postgres_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# --------------------------------------------------------------------------- child: steps


async def child_steps(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS

    tmp = Path(args.tmp)
    backend = args.walk_backend
    if backend == "postgres":
        reset_postgres(args.postgres_url, "dbos_bench_sys")
    config: dict[str, Any] = {
        "name": "jobrun-bench",
        "system_database_url": dbos_url(
            "sqlite" if backend == "sqlite-wal" else backend,
            tmp,
            args.postgres_url,
            "dbos_bench_sys_wal" if backend == "sqlite-wal" else "dbos_bench_sys",
        ),
        "log_level": "WARNING",
    }
    if backend == "sqlite-wal":
        # DBOS's SQLite defaults are a rollback journal with synchronous=FULL (an fsync
        # per commit); this variant gives it jobrun's settings: WAL, synchronous=NORMAL.
        import sqlalchemy as sa

        wal_engine = sa.create_engine(config["system_database_url"])

        @sa.event.listens_for(wal_engine, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")
            dbapi_connection.execute("PRAGMA busy_timeout=30000")

        config["system_database_engine"] = wal_engine
    DBOS(config=config)  # type: ignore[arg-type]

    @DBOS.step()
    async def trivial(i: int) -> int:
        return i

    @DBOS.workflow()
    async def loop(k: int) -> int:
        total = 0
        for i in range(k):
            total += await trivial(i)
        return total

    if backend.startswith("sqlite"):
        jr_url = f"sqlite+aiosqlite:///{tmp / (backend + '-jobrun.db')}"
    else:
        jr_url = args.postgres_url
    engine = create_async_engine(jr_url)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()

    async def steps(p: jobrun.JobPass) -> jobrun.PassResult:
        total = 0
        for i in range(p.payload["k"]):
            total += await p.step(f"s{i}", lambda i=i: i)
        return jobrun.PassResult(done=True)

    registry.register("bench", "steps", steps)
    serial = 0

    async def jobrun_once(k: int) -> float:
        nonlocal serial
        serial += 1
        await jobrun.start_job_run(
            store, module_id="bench", job="steps", instance=f"{uuid.uuid4()}", payload={"k": k}
        )
        t0 = now_ms()
        report = await jobrun.run_due_jobs(store, registry)
        elapsed = now_ms() - t0
        assert report.completed == 1, report
        return elapsed / k

    async def dbos_once(k: int) -> float:
        t0 = now_ms()
        handle = await DBOS.start_workflow_async(loop, k)
        assert await handle.get_result() == k * (k - 1) // 2
        return (now_ms() - t0) / k

    DBOS.launch()
    try:
        ks = args.ks
        await jobrun_once(5)
        await dbos_once(5)
        samples: dict[str, dict[int, list[float]]] = {"jobrun": {}, "dbos": {}}
        for round_number in range(args.repeat):
            for k in ks:
                runners = [("jobrun", jobrun_once), ("dbos", dbos_once)]
                if round_number % 2:
                    runners.reverse()
                for name, runner in runners:
                    samples[name].setdefault(k, []).append(await runner(k))
    finally:
        DBOS.destroy()
        await engine.dispose()
    result: dict[str, Any] = {}
    for k in ks:
        jr = statistics.median(samples["jobrun"][k])
        db = statistics.median(samples["dbos"][k])
        result[str(k)] = {
            "jobrun_ms_per_step": round(jr, 4),
            "dbos_ms_per_step": round(db, 4),
            "dbos_over_jobrun": round(db / jr, 2),
            "samples": len(samples["jobrun"][k]),
        }
    return result


# --------------------------------------------------------------------------- child: recovery


def child_dbos_crash(args: argparse.Namespace) -> None:
    """Run a workflow of R steps, then die inside step R+1 (no clean shutdown)."""
    from dbos import DBOS, SetWorkflowID

    DBOS(
        config={
            "name": "jobrun-bench",
            "system_database_url": args.dbos_url,
            "log_level": "WARNING",
            "executor_id": "crashed"
            if os.environ.get("BENCH_DBOS_PHASE") == "crash"
            else "recoverer",
        }
    )
    r = args.recovery_steps

    @DBOS.step()
    async def trivial(i: int) -> int:
        if i == r and os.environ.get("BENCH_DBOS_PHASE") == "crash":
            os._exit(17)
        if i == r:
            # The first NEW step's body: when it ran, for the parent to read.
            Path(args.mark_file).write_text(str(time.time()))  # noqa: ASYNC240
        return i

    @DBOS.workflow()
    async def long_loop(n: int) -> int:
        total = 0
        for i in range(n + 1):
            total += await trivial(i)
        return total

    async def run() -> None:
        DBOS.launch()
        if os.environ.get("BENCH_DBOS_PHASE") == "crash":
            with SetWorkflowID("recover-me"):
                handle = await DBOS.start_workflow_async(long_loop, r)
            await handle.get_result()
            return
        t0 = time.time()
        handles = DBOS._recover_pending_workflows(["crashed"])
        assert len(handles) == 1, handles
        # A thread waits, so that the loop stays free to run the recovered workflow.
        await asyncio.to_thread(handles[0].get_result)
        first_new = float(Path(args.mark_file).read_text())  # noqa: ASYNC240
        print(json.dumps({"recovery_to_first_new_step_ms": (first_new - t0) * 1000}))
        DBOS.destroy()

    asyncio.run(run())


async def jobrun_recovery(url: str, r: int, repeat: int) -> list[float]:
    engine = create_async_engine(url)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()
    marks: dict[str, float] = {}

    async def long_pass(p: jobrun.JobPass) -> jobrun.PassResult:
        for i in range(r):
            await p.step(f"s{i}", lambda i=i: i)
        if "killed" not in marks:
            marks["killed"] = now_ms()
            raise RuntimeError("killed after R steps")

        def first_new() -> int:
            marks["first_new"] = now_ms()
            return r

        await p.step(f"s{r}", first_new)
        return jobrun.PassResult(done=True)

    registry.register(
        "bench", "long", long_pass, retry=jobrun.RetryPolicy(max_attempts=5, base_delay_ms=0)
    )
    samples = []
    try:
        for _ in range(repeat):
            marks.clear()
            await jobrun.start_job_run(
                store, module_id="bench", job="long", instance=str(uuid.uuid4())
            )
            report = await jobrun.run_due_jobs(store, registry)
            assert report.retrying == 1, report
            t0 = now_ms()
            report = await jobrun.run_due_jobs(store, registry)
            assert report.completed == 1, report
            samples.append(marks["first_new"] - t0)
    finally:
        await engine.dispose()
    return samples


def recovery(args: argparse.Namespace, backend: str, tmp: Path) -> dict[str, Any]:
    r = args.recovery_steps
    repeat = 1 if args.quick else 3
    dbos_samples: list[float] = []
    jobrun_samples: list[float] = []
    for sample in range(repeat):
        name = f"dbos_bench_recovery{sample}"
        if backend == "postgres":
            reset_postgres(args.postgres_url, name)
        url = dbos_url(backend, tmp, args.postgres_url, name)
        mark = tmp / f"mark-{backend}-{sample}"
        base = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "dbos-crash",
            "--dbos-url",
            url,
            "--mark-file",
            str(mark),
            "--recovery-steps",
            str(r),
        ]
        crashed = subprocess.run(
            base, env={**os.environ, "BENCH_DBOS_PHASE": "crash"}, capture_output=True, text=True
        )
        if crashed.returncode != 17:
            raise RuntimeError(
                f"the DBOS crash child exited {crashed.returncode}: {crashed.stderr}"
            )
        recovered = subprocess.run(
            base, env={**os.environ, "BENCH_DBOS_PHASE": "recover"}, capture_output=True, text=True
        )
        if recovered.returncode != 0:
            raise RuntimeError(recovered.stdout + recovered.stderr)
        line = recovered.stdout.strip().splitlines()[-1]
        dbos_samples.append(json.loads(line)["recovery_to_first_new_step_ms"])
        jr_url = (
            f"sqlite+aiosqlite:///{tmp / f'jobrun-recovery{sample}.db'}"
            if backend == "sqlite"
            else args.postgres_url
        )
        jobrun_samples += asyncio.run(jobrun_recovery(jr_url, r, 1))
    db = statistics.median(dbos_samples)
    jr = statistics.median(jobrun_samples)
    return {
        "steps_before_kill": r,
        "dbos_ms": round(db, 2),
        "jobrun_ms": round(jr, 2),
        "dbos_over_jobrun": round(db / jr, 2),
        "dbos_samples": [round(v, 1) for v in dbos_samples],
        "jobrun_samples": [round(v, 1) for v in jobrun_samples],
    }


# --------------------------------------------------------------------------- parent


def main(args: argparse.Namespace) -> int:
    import bench_jobrun as bj

    try:
        import dbos  # noqa: F401
    except ImportError:
        print("vs-dbos skipped: DBOS is not installed (pip install -e '.[bench]')")
        return 0
    from importlib.metadata import version

    meta = bj.meta_for(args)
    meta["dbos"] = version("dbos")
    ks = [20] if args.quick else ([args.k] if args.k else [100, 1000])
    recovery_steps = 50 if args.quick else args.recovery_steps
    repeat = 1 if args.quick else args.repeat or 5
    names = ["sqlite"] + ([] if args.sqlite_only else ["postgres"])
    step_names = [*names, "sqlite-wal"] if not args.quick else names
    results: dict[str, Any] = {"meta": meta, "steps": {}, "recovery": {}}
    with tempfile.TemporaryDirectory(prefix="jobrun-dbos-") as tmp:
        for name in step_names:
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                "steps",
                "--walk-backend",
                name,
                "--tmp",
                tmp,
                "--repeat",
                str(repeat),
                "--postgres-url",
                args.postgres_url,
                *[item for k in ks for item in ("--ks", str(k))],
            ]
            print(f"vs-dbos steps: {name}", flush=True)
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            results["steps"][name] = json.loads(done.stdout.strip().splitlines()[-1])
            if name not in names:
                continue
            print(f"vs-dbos recovery: {name}", flush=True)
            rec_args = argparse.Namespace(**vars(args))
            rec_args.recovery_steps = recovery_steps
            results["recovery"][name] = recovery(rec_args, name, Path(tmp))
    rows: list[tuple[str, list[Any]]] = []
    s = results["steps"]
    for k in ks:
        for label, key in (
            ("jobrun ms/step", "jobrun_ms_per_step"),
            ("DBOS ms/step", "dbos_ms_per_step"),
            ("DBOS / jobrun", "dbos_over_jobrun"),
        ):
            rows.append((f"K={k}: {label}", [s[n][str(k)][key] for n in step_names]))
    rec = results["recovery"]
    for label, key in (
        (f"recovery of {recovery_steps} steps: jobrun ms", "jobrun_ms"),
        (f"recovery of {recovery_steps} steps: DBOS ms", "dbos_ms"),
        ("recovery: DBOS / jobrun", "dbos_over_jobrun"),
    ):
        rows.append((label, [rec[n][key] if n in rec else None for n in step_names]))
    bj.print_table(f"jobrun vs DBOS Transact {meta['dbos']}", step_names, rows)
    bj.write_json(args, "vs-dbos", results)
    return 0


def child_main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", required=True)
    parser.add_argument("--walk-backend")
    parser.add_argument("--tmp")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres-url")
    parser.add_argument("--ks", type=int, action="append")
    parser.add_argument("--dbos-url")
    parser.add_argument("--mark-file")
    parser.add_argument("--recovery-steps", type=int, default=3000)
    args = parser.parse_args()
    if args.child == "steps":
        print(json.dumps(asyncio.run(child_steps(args))))
    elif args.child == "dbos-crash":
        child_dbos_crash(args)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
