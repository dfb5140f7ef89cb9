"""Resuming after kill -9: jobrun next to DBOS Transact, one run of N steps.

Per system and dialect: a child process drives one run (jobrun: one pass of N
steps; DBOS: one workflow of N ``@DBOS.step`` calls with a fixed workflow id),
each step's body waiting ``--body-ms`` and then appending its index and the time
to a log file. When half the bodies have run, the parent kills the child with
SIGKILL and starts a new one at once, which drives the same run again (jobrun
joins the live run and takes it over from the dead holder; DBOS recovers its
pending workflows in ``DBOS.launch()``). Reported, from the log:

* ``first new body, s``: from the new process being ready (imports done, no
  database touched yet) to the first body of a step the killed process had not
  finished;
* ``done, s``: from ready to the run's end (the remaining half included);
* ``bodies run twice``: steps whose body finished in the killed process and ran
  again in the new one: the kill fell between a body's end and the record of
  its result (a body cut short by the kill logged nothing and is not counted).

Procrastinate and Celery are not in it: a task is not resumed part way, and a
task a killed worker held is left to other mechanisms (see
docs/explanation/comparison.md). Needs the ``bench`` extra for DBOS.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import DEFAULT_POSTGRES, backends, options, save, table

RUN_INSTANCE = "resume"
WORKFLOW_ID = "bench-resume"


def log_body(log: Path, index: int) -> None:
    with log.open("a") as file:
        file.write(f"{os.getpid()} {index} {time.time():.6f}\n")


async def jobrun_child(args: Any) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    import jobrun

    ready_at = time.time()
    registry = jobrun.JobRegistry()

    async def body(index: int) -> int:
        await asyncio.sleep(args.body_ms / 1000)  # the simulated body's work
        log_body(args.log, index)
        return index

    @registry.job("bench", "resume")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(args.n):
            await p.step(f"s{index}", lambda index=index: body(index))
        return jobrun.PassResult(done=True)

    engine = create_async_engine(args.url)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(store, module_id="bench", job="resume", instance=RUN_INSTANCE)
    print(json.dumps({"ready_at": ready_at}), flush=True)
    while True:
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        found = await jobrun.get_job_run(store, run.id)
        assert found is not None
        if found.status != "running":
            break
        if report.attempted == 0:
            await asyncio.sleep(0.01)  # poll: the count is a file another process writes
    print(json.dumps({"done_at": time.time(), "status": found.status}), flush=True)
    await engine.dispose()


async def dbos_child(args: Any) -> None:
    import sqlalchemy as sa
    from dbos import DBOS, SetWorkflowID

    ready_at = time.time()
    config: dict[str, Any] = {"name": "jobrun-resume", "log_level": "WARNING"}
    config["system_database_url"] = args.url
    if args.url.startswith("sqlite"):
        wal = sa.create_engine(args.url)

        @sa.event.listens_for(wal, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                dbapi_connection.execute(f"PRAGMA {pragma}")

        config["system_database_engine"] = wal
    DBOS(config=config)  # type: ignore[arg-type]  # DBOS types its config as a TypedDict

    @DBOS.step()
    async def body(index: int) -> int:
        await asyncio.sleep(args.body_ms / 1000)  # the simulated body's work
        log_body(args.log, index)
        return index

    @DBOS.workflow()
    async def workflow(count: int) -> int:
        return sum([await body(index) for index in range(count)])

    print(json.dumps({"ready_at": ready_at}), flush=True)
    DBOS.launch()  # recovers this executor's pending workflows
    if args.first:
        with SetWorkflowID(WORKFLOW_ID):
            handle = await DBOS.start_workflow_async(workflow, args.n)
    else:
        handle = await DBOS.retrieve_workflow_async(WORKFLOW_ID)
    result = await handle.get_result()
    print(json.dumps({"done_at": time.time(), "status": str(result)}), flush=True)
    DBOS.destroy()


def fresh_url(system: str, backend: str, postgres_url: str) -> str:
    """A new, empty database for one measurement, as the child's URL."""
    if backend == "sqlite":
        path = Path(tempfile.mkdtemp(prefix=f"resume-{system}-")) / "resume.db"
        return f"sqlite+aiosqlite:///{path}" if system == "jobrun" else f"sqlite:///{path}"
    import psycopg
    from sqlalchemy import make_url

    name = f"resume_{system}"
    admin = make_url(postgres_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    target = make_url(postgres_url).set(database=name)
    if system == "dbos":
        target = target.set(drivername="postgresql")
    return target.render_as_string(hide_password=False)


def spawn(system: str, url: str, log: Path, n: int, body_ms: float, first: bool) -> Any:
    command = [sys.executable, __file__, "--child", system, "--url", url, "--log", str(log)]
    command += ["--n", str(n), "--body-ms", str(body_ms)] + ["--first"] * first
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def logged(log: Path) -> list[tuple[int, int, float]]:
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(int(pid), int(index), float(at)) for pid, index, at in rows]


def measure(system: str, backend: str, args: Any) -> dict[str, Any]:
    n = 40 if args.quick else args.n
    url = fresh_url(system, backend, args.postgres_url)
    log = Path(tempfile.mkdtemp(prefix="resume-log-")) / "bodies.log"
    first = spawn(system, url, log, n, args.body_ms, first=True)
    deadline = time.monotonic() + 600
    while len(logged(log)) < n // 2:
        assert first.poll() is None, "the first child ended early"
        assert time.monotonic() < deadline, "the first child took too long"
        time.sleep(0.002)  # poll for the child's readiness line; bounds nothing
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_pid, before = first.pid, {index for _pid, index, _at in logged(log)}
    second = spawn(system, url, log, n, args.body_ms, first=False)
    lines = [json.loads(line) for line in second.communicate(timeout=600)[0].splitlines()]
    assert second.returncode == 0, lines
    ready_at = next(line["ready_at"] for line in lines if "ready_at" in line)
    done_at = next(line["done_at"] for line in lines if "done_at" in line)
    rows = logged(log)
    new = [at for pid, index, at in rows if pid == second.pid and index not in before]
    twice = {index for pid, index, _at in rows if pid == second.pid} & before
    assert {index for _pid, index, _at in rows} == set(range(n)), "a step never ran"
    assert killed_pid != second.pid
    return {
        "steps": n,
        "done before the kill": len(before),
        "first new body, s": round(min(new) - ready_at, 3),
        "done, s": round(done_at - ready_at, 3),
        "bodies run twice": len(twice),
    }


async def child_main(args: Any) -> None:
    await (jobrun_child(args) if args.child == "jobrun" else dbos_child(args))


def scenario(args: Any) -> None:
    systems = ["jobrun"] + ["dbos"] * (importlib.util.find_spec("dbos") is not None)
    results: dict[str, Any] = {}
    rows = []
    for backend in backends(args):
        for system in systems:
            found = measure(system, backend, args)
            results[f"{backend}-{system}"] = found
            rows.append([backend, system, *found.values()])
    table(
        f"kill -9 at half way, then restart (body {args.body_ms} ms)",
        ["", "", "steps", "done before kill", "first new body, s", "done, s", "run twice"],
        rows,
    )
    save(args, "compare-resume", results)


if __name__ == "__main__":
    if "--child" in sys.argv:
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--child", choices=["jobrun", "dbos"])
        parser.add_argument("--url", default=DEFAULT_POSTGRES)
        parser.add_argument("--log", type=Path)
        parser.add_argument("--n", type=int)
        parser.add_argument("--body-ms", type=float)
        parser.add_argument("--first", action="store_true")
        asyncio.run(child_main(parser.parse_args()))
    else:
        scenario(options(__doc__ or "", n=1000, body_ms=2.0))
