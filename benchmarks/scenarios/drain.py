"""The 5,000-run drain: runs/s of 1 and 4 worker processes, jobrun beside PgQueuer, Procrastinate.

Run on demand from the repository root (not part of the test suite; Postgres only)::

    .venv/bin/python -m benchmarks drain                   # 5,000 jobs, 1 and 4 workers, 3 rounds
    .venv/bin/python -m benchmarks drain --quick --systems jobrun

One sample: a new database (unique name, dropped right after); the system's
schema; ``--workers`` worker processes started and idle (each has a connection
on the database, then ``--settle-s`` more); ``--jobs`` trivial jobs enqueued in
one batch; the time from the batch's return until none is left to do (the
database polled every 20 ms). The figure is runs/s over that time; the batch's
own rate (connecting included) is given beside it. Every system runs its own worker with its
defaults, one process each:

* jobrun: ``python -m jobrun worker`` (the CLI; ``--jobrun-args`` adds options),
  the job ``bench/drain`` of one step, started with ``jobrun.start_job_runs``;
* PgQueuer: ``QueueManager.run`` on one asyncpg connection, entrypoint
  ``drain``, jobs enqueued with ``Queries.enqueue`` (lists);
* Procrastinate: ``App.run_worker_async``, task ``bench.drain``, jobs with
  ``batch_defer_async``.

Each variant (system × worker count) gives one sample per round, the order
rotating each round; each figure is the median of the rounds with its spread,
and the load average is printed with it. PgQueuer and Procrastinate come from
the ``bench`` extra and are left out when not installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks import harness
from benchmarks.processes import drain_apps

POLL_S = 0.02


@dataclass(frozen=True)
class System:
    """How one system's sample is set up, filled, watched and worked off."""

    name: str
    install: Callable[[str], Awaitable[None]]
    enqueue: Callable[[str, int], Awaitable[None]]
    left: str  # a query: how many jobs are still to do
    worker: Callable[[str, Any], list[str]]


async def _jobrun_install(url: str) -> None:
    engine = create_async_engine(url)
    try:
        await jobrun.upgrade(engine)
    finally:
        await engine.dispose()


async def _jobrun_enqueue(url: str, count: int) -> None:
    engine = create_async_engine(url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        module, job = drain_apps.JOBRUN_JOB
        starts = [
            jobrun.JobStart(module_id=module, job=job, instance=f"i{n}", payload={"n": n})
            for n in range(count)
        ]
        await jobrun.start_job_runs(store, starts)
    finally:
        await engine.dispose()


def _jobrun_worker(url: str, args: Any) -> list[str]:
    command = [sys.executable, "-m", "jobrun", "worker", "--url", url]
    command += ["--app", "benchmarks.processes.drain_apps:registry", "--log-level", "warning"]
    return command + (args.jobrun_args.split() if args.jobrun_args else [])


async def _pgqueuer_install(url: str) -> None:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(harness.plain_url(url))
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def _pgqueuer_enqueue(url: str, count: int) -> None:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(harness.plain_url(url))
    try:
        queries = Queries(AsyncpgDriver(connection))
        names = [drain_apps.PGQUEUER_ENTRYPOINT] * count
        await queries.enqueue(names, [str(n).encode() for n in range(count)], [0] * count)
    finally:
        await connection.close()


async def _procrastinate_install(url: str) -> None:
    app = drain_apps.procrastinate_app(harness.plain_url(url))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def _procrastinate_enqueue(url: str, count: int) -> None:
    app = drain_apps.procrastinate_app(harness.plain_url(url))
    async with app.open_async():
        task = app.tasks[drain_apps.PROCRASTINATE_TASK]
        await task.batch_defer_async(*({"index": n} for n in range(count)))


def _peer_worker(name: str) -> Callable[[str, Any], list[str]]:
    def command(url: str, args: Any) -> list[str]:
        module = "benchmarks.processes.drain_peer"
        return [sys.executable, "-m", module, name, harness.plain_url(url)]

    return command


SYSTEMS = {
    "jobrun": System(
        "jobrun",
        _jobrun_install,
        _jobrun_enqueue,
        "SELECT count(*) FROM _substrat_job_runs WHERE status = 'running'",
        _jobrun_worker,
    ),
    "pgqueuer": System(
        "pgqueuer",
        _pgqueuer_install,
        _pgqueuer_enqueue,
        "SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')",
        _peer_worker("pgqueuer"),
    ),
    "procrastinate": System(
        "procrastinate",
        _procrastinate_install,
        _procrastinate_enqueue,
        "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        _peer_worker("procrastinate"),
    ),
}


def installed(name: str) -> bool:
    return name == "jobrun" or importlib.util.find_spec(name) is not None


async def _connected(watcher: asyncpg.Connection) -> int:
    """Backends on the watcher's database, other than the watcher's own."""
    found = await watcher.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return int(found)


async def _until_ready(
    watcher: asyncpg.Connection, workers: list[subprocess.Popen[bytes]], timeout_s: float
) -> None:
    """Every worker has a connection on the database (or the wait times out)."""
    deadline = time.monotonic() + timeout_s
    # Other processes' connections: nothing to wait on but a poll.
    while await _connected(watcher) < len(workers):
        if any(worker.poll() is not None for worker in workers):
            raise RuntimeError("a worker process ended before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not connected after {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


def _spawn(command: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    environment = harness.child_environment()
    return [subprocess.Popen(command, cwd=harness.REPO, env=environment) for _ in range(count)]


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


async def _drain_sample(args: Any, system: System, count: int) -> dict[str, float]:
    """One sample: a new database, ``count`` workers idle on it, the batch, the drain."""
    url = await args.databases.postgres_url()
    await system.install(url)
    watcher = await asyncpg.connect(harness.plain_url(url))
    workers = _spawn(system.worker(url, args), count)
    try:
        await _until_ready(watcher, workers, args.ready_timeout_s)
        await asyncio.sleep(args.settle_s)
        began = time.perf_counter()
        await system.enqueue(url, args.jobs)
        enqueued = time.perf_counter()
        while await watcher.fetchval(system.left):
            if time.perf_counter() - enqueued > args.drain_timeout_s:
                raise RuntimeError(f"{system.name}: not drained in {args.drain_timeout_s} s")
            await asyncio.sleep(POLL_S)
        drained = time.perf_counter()
    finally:
        _stop(workers)
        await watcher.close()
        await args.databases.drop_postgres(url)
    return {
        "runs_per_s": args.jobs / (drained - enqueued),
        "enqueue_per_s": args.jobs / (enqueued - began),
    }


def _variants(args: Any) -> dict[str, Callable[[], Awaitable[dict[str, float]]]]:
    counts = [int(part) for part in args.workers.split(",")]
    names = [name for name in args.systems.split(",") if installed(name)]
    variants = {}
    for name in names:
        for count in counts:

            async def sample(system: System = SYSTEMS[name], count: int = count) -> Any:
                return await _drain_sample(args, system, count)

            variants[f"{name}/{count}"] = sample
    return variants


async def scenario(args: Any) -> None:
    if args.sqlite_only:
        print("drain runs on Postgres only (the peers need it): nothing to do with --sqlite-only")
        return
    if args.quick:
        args.jobs, args.settle_s = 200, 0.5
    rounds = args.rounds or (1 if args.quick else 3)
    variants = _variants(args)
    samples = await harness.interleave_samples(variants, rounds, order="rotate", warm_ups=0)
    results: dict[str, Any] = {"jobs": args.jobs, "rounds": rounds}
    rows = []
    for variant, found in samples.items():
        rate = harness.spread([sample["runs_per_s"] for sample in found])
        enqueue = harness.spread([sample["enqueue_per_s"] for sample in found])
        results[variant] = {"runs_per_s": rate, "enqueue_per_s": enqueue}
        system, count = variant.split("/")
        rows.append([system, count, harness.shown(rate, 0), harness.shown(enqueue, 0)])
    for name in {variant.split("/")[0] for variant in samples}:
        one, four = samples.get(f"{name}/1"), samples.get(f"{name}/4")
        if one and four:
            ratios = harness.round_ratios(
                [sample["runs_per_s"] for sample in four], [sample["runs_per_s"] for sample in one]
            )
            results[f"{name}/4 over 1"] = ratios
            rows.append([name, "4 / 1", harness.shown(ratios, 2, "x"), ""])
    harness.table(
        f"{args.jobs} trivial jobs drained, runs/s (load {harness.load()})",
        ["system", "workers", "runs/s median [q1-q3]", "batch enqueue/s"],
        rows,
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(
        scenario,
        jobs=5000,
        workers="1,4",
        systems="jobrun,pgqueuer,procrastinate",
        jobrun_args="",
        settle_s=1.0,
        ready_timeout_s=60.0,
        drain_timeout_s=600.0,
    )
