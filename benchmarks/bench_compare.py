"""jobrun next to DBOS Transact, Procrastinate and Celery: the same small workload.

One unit of work is a trivial body (it returns its argument) whose completion is
recorded in the database; a sample is N units handed over and waited for, and
the figure is wall-clock ms per unit, from handing the work over to seeing all
of it done. Interleaved in one process (the harness's method), medians:

* jobrun: one run whose one pass makes N steps (``start_job_run`` then
  ``run_due_jobs``); each step is one durable write, the bodies run in the pass;
* DBOS: one workflow of N ``@DBOS.step`` calls (``start_workflow_async`` then the
  result); each step is one checkpoint in its system database;
* Procrastinate (Postgres only): N tasks deferred one by one (an INSERT each),
  then a worker (``run_worker_async(wait=False)``, concurrency 1, in this
  process) works them off; each task is a job row fetched, run and marked done;
* Celery: N tasks sent one by one (``delay``) through kombu's SQLAlchemy
  transport, a solo worker in a child process, results in Celery's database
  backend; the sample ends when N results read SUCCESS.

The units are not the same thing (see docs/explanation/comparison.md): a step
is a checkpoint inside a resumable run, a Procrastinate or Celery task is a
queued message. Each system that is not installed (the ``bench`` extra) is
left out; Procrastinate needs Postgres.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from harness import (
    HERE,
    backends,
    driver_dsn,
    fresh_engine,
    interleave,
    options,
    save,
    table,
    timed_ms,
)
from sqlalchemy import make_url

import jobrun

Sample = Any


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def jobrun_runner(store: jobrun.SqlJobRunStore, n: int) -> Sample:
    registry = jobrun.JobRegistry()

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(n):
            await p.step(f"s{index}", lambda index=index: index)
        return jobrun.PassResult(done=True)

    registry.register("bench", "compare", handler)

    async def sample() -> float:
        started = time.perf_counter()
        await jobrun.start_job_run(
            store, module_id="bench", job="compare", instance=uuid.uuid4().hex
        )
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        assert report.completed == 1, report
        return timed_ms(started, n)

    return sample


def fresh_postgres(postgres_url: str, name: str) -> str:
    """A new, empty Postgres database; its plain (libpq) URL."""
    import psycopg

    admin = make_url(postgres_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin.set(database=name).render_as_string(hide_password=False)


def dbos_runner(backend: str, args: Any, n: int) -> tuple[Sample, Any]:
    """DBOS keeps one global instance per process, bound to one system database."""
    import sqlalchemy as sa
    from dbos import DBOS

    config: dict[str, Any] = {"name": "jobrun-compare", "log_level": "WARNING"}
    if backend == "sqlite":
        config["system_database_url"] = f"sqlite:///{Path(tempfile.mkdtemp()) / 'dbos.sqlite'}"
        wal = sa.create_engine(config["system_database_url"])

        @sa.event.listens_for(wal, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                dbapi_connection.execute(f"PRAGMA {pragma}")

        config["system_database_engine"] = wal
    else:
        config["system_database_url"] = fresh_postgres(args.postgres_url, "dbos_compare_sys")
    DBOS(config=config)  # type: ignore[arg-type]  # DBOS types its config as a TypedDict

    @DBOS.step()
    async def trivial(index: int) -> int:
        return index

    @DBOS.workflow()
    async def workflow(count: int) -> int:
        return sum([await trivial(index) for index in range(count)])

    DBOS.launch()

    async def sample() -> float:
        started = time.perf_counter()
        handle = await DBOS.start_workflow_async(workflow, n)
        assert await handle.get_result() == n * (n - 1) // 2
        return timed_ms(started, n)

    return sample, DBOS.destroy


async def procrastinate_runner(args: Any, n: int, enqueue_ms: list[float]) -> tuple[Sample, Any]:
    import procrastinate

    conninfo = fresh_postgres(args.postgres_url, "procrastinate_compare")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="bench.trivial")
    async def trivial(index: int) -> int:
        return index

    await app.open_async()
    await app.schema_manager.apply_schema_async()

    async def sample() -> float:
        started = time.perf_counter()
        for index in range(n):
            await trivial.defer_async(index=index)
        enqueue_ms.append(timed_ms(started, n))
        await app.run_worker_async(wait=False, concurrency=1, install_signal_handlers=False)
        elapsed = timed_ms(started, n)
        # procrastinate types its connector as the base class, without a pool.
        async with app.connector.pool.connection() as connection:  # type: ignore[attr-defined]
            cursor = await connection.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
            )
            assert (await cursor.fetchone()) == (0,)
        return elapsed

    return sample, app.close_async


def celery_urls(backend: str, args: Any) -> tuple[str, str]:
    if backend == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="celery-compare-"))
        return (
            f"sqla+sqlite:///{folder / 'broker.sqlite'}",
            f"db+sqlite:///{folder / 'results.sqlite'}",
        )
    broker = fresh_postgres(args.postgres_url, "celery_compare_broker")
    results = fresh_postgres(args.postgres_url, "celery_compare_results")
    to_psycopg = "postgresql+psycopg://"
    return (
        "sqla+" + broker.replace("postgresql://", to_psycopg, 1),
        "db+" + results.replace("postgresql://", to_psycopg, 1),
    )


def celery_runner(backend: str, args: Any, n: int, enqueue_ms: list[float]) -> tuple[Sample, Any]:
    broker, results = celery_urls(backend, args)
    os.environ["BENCH_CELERY_BROKER"], os.environ["BENCH_CELERY_BACKEND"] = broker, results
    import sqlalchemy as sa
    from bench_compare_celery import app, trivial

    app.conf.broker_url, app.conf.result_backend = broker, results
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "bench_compare_celery", "worker", "-P", "solo"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"),
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}"},
    )
    trivial.delay(-1).get(timeout=120)  # the worker is up and both tables exist
    worker.send_signal(signal.SIGSTOP)
    counter = sa.create_engine(results.removeprefix("db+"))
    count_done = sa.text("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")

    def done() -> int:
        with counter.connect() as connection:
            return int(connection.execute(count_done).scalar_one())

    async def sample() -> float:
        worker.send_signal(signal.SIGCONT)
        before = done()
        started = time.perf_counter()
        for index in range(n):
            trivial.delay(index)
        enqueue_ms.append(timed_ms(started, n))
        # The results are rows another process writes: nothing to wait on but a poll.
        while done() < before + n:  # noqa: ASYNC110 (rows of another process: no event)
            await asyncio.sleep(0.005)
        elapsed = timed_ms(started, n)
        # Between its samples the idle worker would poll the broker every 10 ms,
        # taking CPU and database time from the other systems' samples: stop it.
        worker.send_signal(signal.SIGSTOP)
        return elapsed

    def close() -> None:
        worker.send_signal(signal.SIGCONT)
        worker.terminate()
        worker.wait(timeout=60)
        counter.dispose()

    return sample, close


async def measure(backend: str, args: Any) -> dict[str, Any]:
    n = 20 if args.quick else args.n
    rounds = args.rounds or (1 if args.quick else 5)
    engine = await fresh_engine(backend, args)
    assert driver_dsn(engine)
    variants = {"jobrun": jobrun_runner(jobrun.SqlJobRunStore(engine), n)}
    closers: list[Any] = [engine.dispose]
    enqueue: dict[str, list[float]] = {"procrastinate": [], "celery": []}
    if installed("dbos"):
        variants["dbos"], close = dbos_runner(backend, args, n)
        closers.append(close)
    if installed("procrastinate") and backend == "postgres":
        variants["procrastinate"], close = await procrastinate_runner(
            args, n, enqueue["procrastinate"]
        )
        closers.append(close)
    if installed("celery"):
        variants["celery"], close = celery_runner(backend, args, n, enqueue["celery"])
        closers.append(close)
    try:
        medians: dict[str, Any] = await interleave(variants, rounds)
    finally:
        for close in reversed(closers):
            outcome = close()
            if asyncio.iscoroutine(outcome):
                await outcome
    for name, values in enqueue.items():
        if values:
            medians[f"{name} enqueue only"] = round(statistics.median(values), 4)
    medians["units"] = n
    return medians


def child(backend: str) -> dict[str, Any]:
    """DBOS keeps one global instance per process (and shuts the loop's default
    executor down when destroyed): each dialect runs in its own child process."""
    command = [sys.executable, __file__, *sys.argv[1:], "--child", backend]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=3600, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def scenario(args: Any) -> None:
    if args.child:
        print(json.dumps(await measure(args.child, args)))
        return
    results = {backend: child(backend) for backend in backends(args)}
    rows = []
    for backend, found in results.items():
        for name, value in found.items():
            if name != "units":
                ratio = value / found["jobrun"]
                rows.append([backend, name, f"{value:.3f}", f"{ratio:.1f}x"])
    units = results[backends(args)[0]]["units"]
    table(f"ms per unit of work, {units} units per sample", ["", "", "ms/unit", "/ jobrun"], rows)
    save(args, "compare", results)


if __name__ == "__main__":
    asyncio.run(scenario(options(__doc__ or "", n=1000, child="")))
