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
import time
from typing import Any

import jobrun
from benchmarks import harness
from benchmarks.processes.dbos_app import dbos_runner


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def jobrun_runner(store: jobrun.SqlJobRunStore, n: int) -> harness.Sample:
    registry = jobrun.JobRegistry()
    registry.register("bench", "compare", harness.trivial_steps(n))

    async def sample() -> float:
        started = time.perf_counter()
        await harness.drive_one(store, registry, "compare")
        return harness.timed_ms(started, n)

    return sample


async def procrastinate_runner(
    databases: harness.Databases, n: int, enqueue_ms: list[float]
) -> tuple[harness.Sample, Any]:
    import procrastinate

    conninfo = await databases.postgres_url("postgresql")
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
        enqueue_ms.append(harness.timed_ms(started, n))
        await app.run_worker_async(wait=False, concurrency=1, install_signal_handlers=False)
        elapsed = harness.timed_ms(started, n)
        # procrastinate types its connector as the base class, without a pool.
        async with app.connector.pool.connection() as connection:  # type: ignore[attr-defined]
            cursor = await connection.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
            )
            assert (await cursor.fetchone()) == (0,)
        return elapsed

    return sample, app.close_async


async def celery_urls(databases: harness.Databases, backend: str) -> tuple[str, str]:
    """Kombu's SQLAlchemy broker and Celery's database result backend, new databases."""
    if backend == "sqlite":
        broker = f"sqlite:///{databases.sqlite_path('celery-broker')}"
        results = f"sqlite:///{databases.sqlite_path('celery-results')}"
    else:
        broker = await databases.postgres_url("postgresql+psycopg")
        results = await databases.postgres_url("postgresql+psycopg")
    return "sqla+" + broker, "db+" + results


def celery_runner(
    urls: tuple[str, str], n: int, enqueue_ms: list[float]
) -> tuple[harness.Sample, Any]:
    broker, results = urls
    os.environ["BENCH_CELERY_BROKER"], os.environ["BENCH_CELERY_BACKEND"] = broker, results
    import sqlalchemy as sa

    from benchmarks.processes.celery_app import app, trivial

    app.conf.broker_url, app.conf.result_backend = broker, results
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "benchmarks.processes.celery_app", "worker"),
            *("-P", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat"),
            *("-l", "WARNING"),
        ],
        cwd=harness.REPO,
        env=harness.child_environment(),
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
        enqueue_ms.append(harness.timed_ms(started, n))
        # The results are rows another process writes: nothing to wait on but a poll.
        while done() < before + n:  # noqa: ASYNC110 (rows of another process: no event)
            await asyncio.sleep(0.005)
        elapsed = harness.timed_ms(started, n)
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
    databases = args.databases
    engine = await databases.engine(backend)
    variants = {"jobrun": jobrun_runner(jobrun.SqlJobRunStore(engine), n)}
    closers: list[Any] = [engine.dispose]
    enqueue: dict[str, list[float]] = {"procrastinate": [], "celery": []}
    if installed("dbos"):
        variants["dbos"], close = await dbos_runner(databases, backend, "jobrun-compare", n)
        closers.append(close)
    if installed("procrastinate") and backend == "postgres":
        variants["procrastinate"], close = await procrastinate_runner(
            databases, n, enqueue["procrastinate"]
        )
        closers.append(close)
    if installed("celery"):
        urls = await celery_urls(databases, backend)
        variants["celery"], close = celery_runner(urls, n, enqueue["celery"])
        closers.append(close)
    try:
        medians: dict[str, Any] = await harness.interleave(variants, rounds)
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
    command = [sys.executable, "-m", "benchmarks.scenarios.compare", *sys.argv[1:]]
    done = subprocess.run(
        [*command, "--child", backend],
        stdout=subprocess.PIPE,
        text=True,
        timeout=3600,
        check=True,
        env=harness.child_environment(),
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def scenario(args: Any) -> None:
    if args.child:
        print(json.dumps(await measure(args.child, args)))
        return
    results = {backend: child(backend) for backend in harness.backends(args)}
    rows = []
    for backend, found in results.items():
        for name, value in found.items():
            if name != "units":
                ratio = value / found["jobrun"]
                rows.append([backend, name, f"{value:.3f}", f"{ratio:.1f}x"])
    units = results[harness.backends(args)[0]]["units"]
    harness.table(
        f"ms per unit of work, {units} units per sample", ["", "", "ms/unit", "/ jobrun"], rows
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, n=1000, child="")
