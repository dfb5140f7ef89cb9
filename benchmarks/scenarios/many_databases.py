"""One ``jobrun worker`` over many scope databases: what it holds, what it costs idle,
how soon it drives and how soon it picks up a run another process started.

Run on demand from the repository root::

    .venv/bin/python -m benchmarks many_databases --sqlite 300 --postgres 10
    .venv/bin/python -m benchmarks many_databases --sqlite 1000 --postgres 50
    .venv/bin/python -m benchmarks many_databases --quick      # 50 files, 3 databases

N SQLite files (one migrated, then copied) and M Postgres databases (the harness's
throwaways on the server of ``--postgres-url``: names of this run alone, dropped when
it ends) are listed in a URLs file. One run is
started in the last SQLite file and one in the last Postgres database listed, then
one worker is started as a subprocess
(``--urls-file`` when the checkout's worker has it, else every URL in
``JOBRUN_DATABASE_URL``, so the same script measures a checkout from before).
Measured: seconds from the spawn to the later of those runs' passes ("first
drive": by then every database was looked at); over ``--idle-s`` of idleness, the worker's CPU
(utime + stime from ``/proc/PID/stat``) as a share of one core; then its RSS,
open descriptors, threads, and its Postgres connections (``pg_stat_activity`` on
the benchmark's databases; the benchmark holds none meanwhile); then
``--starts`` runs started by this process, one every ``--gap-s`` seconds, each in
a database picked at random (SQLite and Postgres in turn): the pickup latency
(wall clock from just before ``start_job_run`` to the start of the run's pass,
written by the job itself, ``benchmarks/processes/many_app.py``), median, p99 and max per dialect.
The load average is recorded before and after. "first drive" is also given from
the worker's "worker started" log line (its imports and set-up behind it).
``--held-by-peer N`` leases a run in the first N databases of each kind to a live
process standing for another worker, for the idle window: the worker then looks
at each for its holder's death twice a second, and the idle CPU measures that.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import jobrun
from benchmarks import harness
from benchmarks.harness.server_usage import process_cpu_s
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun._host.system import local_identity


async def sqlite_urls(directory: Path, count: int) -> list[str]:
    paths = await harness.migrated_sqlite_files(directory, count)
    return [f"sqlite+aiosqlite:///{path}" for path in paths]


async def postgres_urls(databases: harness.Databases, count: int) -> list[str]:
    """``count`` fresh, upgraded throwaway databases (dropped with the run's others)."""
    urls = []
    for _ in range(count):
        url = await databases.postgres_url()
        engine = create_async_engine(url, poolclass=NullPool)
        await jobrun.upgrade(engine)
        await engine.dispose()
        urls.append(url)
    return urls


async def start_pickup(url: str, log: Path, label: str) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        store = jobrun.SqlJobRunStore(engine)
        payload = {"started": time.time(), "log": str(log), "label": label}
        await jobrun.start_job_run(
            store, module_id="bench", job="pickup", instance=label, payload=payload
        )
    finally:
        await engine.dispose()


def peer_process() -> tuple[subprocess.Popen[bytes], str]:
    """A live process standing for a peer worker, and a ``lease_driver`` naming it."""
    peer = subprocess.Popen(["sleep", "3600"])
    stat = Path(f"/proc/{peer.pid}/stat").read_text().rsplit(")", 1)[1].split()
    here = local_identity()
    driver = replace(here, host="peer", pid=peer.pid, start_ticks=int(stat[19])).describe("peer")
    return peer, driver


async def hold_by_peer(urls: list[str], count: int, log: Path) -> subprocess.Popen[bytes] | None:
    """With ``--held-by-peer N``: in the first N databases of each kind, a run leased
    for ten minutes by a live process of ours standing for a peer worker (``sleep``),
    so that the worker looks at each of them for its holder's death twice a second
    (jobrun.worker.deaths): the idle CPU then measures those looks."""
    if count <= 0:
        return None
    peer, driver = peer_process()
    chosen = [url for url in urls if url.startswith("sqlite")][:count]
    chosen += [url for url in urls if url.startswith("postgresql")][:count]
    for number, url in enumerate(chosen):
        label = f"held-{number}"
        await start_pickup(url, log, label)
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            now_at = format_instant(datetime.now(UTC))
            expiry = add_milliseconds(now_at, 600_000)
            request = ClaimRequest(now_at, f"PEER{number}", driver, {("bench", "pickup"): expiry})
            assert await jobrun.SqlJobRunStore(engine).claim(request) is not None
        finally:
            await engine.dispose()
    return peer


def picked(log: Path) -> dict[str, float]:
    """label -> pickup latency in seconds, from the job's own lines."""
    found = {}
    if log.exists():
        for line in log.read_text().splitlines():
            started, at, label = line.split(" ", 2)
            found[label] = float(at) - float(started)
    return found


def picked_instants(log: Path) -> dict[str, float]:
    """label -> when its pass began (wall clock), from the job's own lines."""
    found = {}
    for line in log.read_text().splitlines():
        _, at, label = line.split(" ", 2)
        found[label] = float(at)
    return found


def process_figures(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def cpu_seconds(pid: int) -> float:
    spent = process_cpu_s(pid)
    assert spent is not None, f"no /proc/{pid}/stat"
    return spent


async def postgres_connections(base: str, urls: list[str]) -> int:
    """Connections to this run's databases (those of ``urls``), not another run's."""
    import asyncpg

    names = [make_url(url).database for url in urls if url.startswith("postgresql")]

    admin = await asyncpg.connect(harness.plain_url(base))
    try:
        return int(
            await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY($1::text[])",
                names,
            )
        )
    finally:
        await admin.close()


def has_urls_file() -> bool:
    shown = subprocess.run(
        [sys.executable, "-m", "jobrun", "worker", "--help"],
        capture_output=True,
        text=True,
        env=harness.child_environment(),
        check=False,
    )
    return "--urls-file" in shown.stdout


def spawn(urls_file: Path, urls: list[str], extra: list[str], log: Path) -> subprocess.Popen[str]:
    env = harness.child_environment()
    app = "benchmarks.processes.many_app:registry"
    command = [sys.executable, "-m", "jobrun", "worker", "--app", app]
    command += ["--log-level", "info", *extra]
    if has_urls_file():
        command += ["--urls-file", str(urls_file)]
    else:
        env["JOBRUN_DATABASE_URL"] = " ".join(urls)
    return subprocess.Popen(
        command,
        cwd=harness.REPO,
        env=env,
        stderr=log.open("w"),
        stdout=subprocess.DEVNULL,
        text=True,
    )


async def wait_for(log: Path, labels: set[str], timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = picked(log)
        if labels <= set(found) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)  # poll: the job's lines are a file another process writes


def latency_summary(values: list[float], asked: int) -> dict[str, Any]:
    if not values:
        return {"asked": asked, "picked": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "asked": asked,
        "picked": len(values),
        "median_s": round(statistics.median(ordered), 3),
        "p99_s": round(p99, 3),
        "max_s": round(ordered[-1], 3),
    }


async def scenario(args: Any) -> None:
    sizes = (
        (50, 3, 10, 3.0) if args.quick else (args.sqlite, args.postgres, args.starts, args.idle_s)
    )
    sqlite_count, postgres_count, starts, idle_s = sizes
    if args.sqlite_only:
        postgres_count = 0
    directory = args.databases.folder
    load_before = harness.load()
    urls = await sqlite_urls(directory, sqlite_count)
    urls += await postgres_urls(args.databases, postgres_count)
    urls_file = directory / "urls.txt"
    urls_file.write_text("# the benchmark's scope databases\n" + "\n".join(urls) + "\n")
    pickups = directory / "pickups.log"
    # Before any other run: the peer's claims take the only run of each database.
    peer = await hold_by_peer(urls, args.held_by_peer, directory / "held.log")
    worker = None
    try:
        firsts = await first_runs(urls, pickups)
        extra = args.worker_args.split() if args.worker_args else []
        spawned_at = time.time()
        worker = spawn(urls_file, urls, extra, directory / "worker.log")
        results = await measure(
            args, worker, urls, pickups, (spawned_at, set(firsts)), starts, idle_s
        )
    finally:
        stop(worker, peer)
    results["worker_log_tail"] = (directory / "worker.log").read_text()[-2000:]
    results["sizes"] = {"sqlite": sqlite_count, "postgres": postgres_count, "starts": starts}
    results["held_by_peer"] = args.held_by_peer
    results["load_before"] = load_before
    results["load_after"] = harness.load()
    report(results)
    harness.save(args, results)


async def first_runs(urls: list[str], pickups: Path) -> dict[str, str]:
    """A run waits in the last database of each kind listed: "first drive" is when the
    later of them starts its pass (every database has been looked at)."""
    firsts = {}
    for kind, prefix in (("sqlite", "sqlite"), ("postgres", "postgresql")):
        listed = [url for url in urls if url.startswith(prefix)]
        if listed:
            firsts[f"first-{kind}"] = listed[-1]
            await start_pickup(listed[-1], pickups, f"first-{kind}")
    return firsts


def stop(worker: subprocess.Popen[str] | None, peer: subprocess.Popen[bytes] | None) -> None:
    """The peer standing in for another worker, then the worker (SIGTERM, at most 30 s)."""
    if peer is not None:
        peer.kill()
        peer.wait()
    if worker is None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def has_started(log: Path) -> bool:
    return log.exists() and "worker started" in log.read_text()


async def started_line(log: Path, timeout_s: float) -> float | None:
    """When the worker's "worker started" line was first seen in its log (None: not yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if has_started(log):
            return time.time()
        await asyncio.sleep(0.02)  # poll: the worker's log is another process's file
    return None


async def measure(
    args: Any,
    worker: subprocess.Popen[str],
    urls: list[str],
    pickups: Path,
    spawn: tuple[float, set[str]],
    starts: int,
    idle_s: float,
) -> dict[str, Any]:
    began_at = await started_line(pickups.with_name("worker.log"), args.spawn_timeout_s)
    spawned_at, firsts = spawn
    await wait_for(pickups, firsts, args.spawn_timeout_s)
    picked_at = picked_instants(pickups)
    results: dict[str, Any] = {}
    for label in sorted(firsts):
        results[f"first_drive_s ({label})"] = (
            round(picked_at[label] - spawned_at, 2) if label in picked_at else "none"
        )
    if all(label in picked_at for label in firsts):
        last_at = max(picked_at[label] for label in firsts)
        results["first_drive_s"] = round(last_at - spawned_at, 2)
        if began_at is not None:
            results["first_drive_after_started_line_s"] = round(last_at - began_at, 2)
    else:
        results["first_drive_s"] = f"not all within {args.spawn_timeout_s} s"
    await asyncio.sleep(2.0)  # let the first drives' work settle before idle is measured
    cpu_before = cpu_seconds(worker.pid)
    await asyncio.sleep(idle_s)  # the idle window whose CPU is measured
    results["idle_cpu_percent"] = round(100 * (cpu_seconds(worker.pid) - cpu_before) / idle_s, 2)
    results |= process_figures(worker.pid)
    postgres = [url for url in urls if url.startswith("postgresql")]
    if postgres:
        results["postgres_connections_idle"] = await postgres_connections(args.postgres_url, urls)
    chosen = random.Random(args.seed)
    labels: dict[str, str] = {}
    sqlite = [url for url in urls if not url.startswith("postgresql")]
    for number in range(starts):
        # Alternately a SQLite file and a Postgres database, each picked at random.
        url = chosen.choice(postgres if number % 2 and postgres else sqlite or postgres)
        label = f"start-{number}"
        labels[label] = "postgres" if url.startswith("postgresql") else "sqlite"
        await start_pickup(url, pickups, label)
        await asyncio.sleep(args.gap_s * (0.5 + chosen.random()))  # the starts' spacing
    found = await wait_for(pickups, set(labels), 30.0)
    for dialect in ("sqlite", "postgres"):
        asked = [label for label, kind in labels.items() if kind == dialect]
        values = [found[label] for label in asked if label in found]
        results[f"pickup_{dialect}"] = latency_summary(values, len(asked))
    results |= {f"{key}_after_starts": value for key, value in process_figures(worker.pid).items()}
    if postgres:
        after = await postgres_connections(args.postgres_url, urls)
        results["postgres_connections_after_starts"] = after
    return results


def report(results: dict[str, Any]) -> None:
    rows = [
        [key, value]
        for key, value in results.items()
        if key not in ("worker_log_tail",) and not isinstance(value, dict)
    ]
    rows += [[key, value] for key, value in results.items() if isinstance(value, dict)]
    harness.table("one worker over many databases", ["figure", "value"], rows)


if __name__ == "__main__":
    harness.run(
        scenario,
        sqlite=300,
        postgres=10,
        starts=50,
        idle_s=10.0,
        gap_s=0.2,
        seed=7,
        worker_args="",
        spawn_timeout_s=120.0,
        held_by_peer=0,
    )
