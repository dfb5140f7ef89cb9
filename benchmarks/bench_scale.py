"""Many drivers on one database: the scaling curve, correctness under load, takeover latency.

Run on demand from the repository root (not part of the test suite)::

    .venv/bin/python benchmarks/bench_scale.py                 # Postgres + SQLite, full
    .venv/bin/python benchmarks/bench_scale.py --quick         # smoke run, SQLite, seconds
    .venv/bin/python benchmarks/bench_scale.py --backends postgres --runs 500 --drivers 1,4

Each driver is ``benchmarks/scale_child.py`` in its own OS process, with its own
engine, calling ``jobrun.run_due_jobs`` in a loop until no running run is left.
For every (backend, mode, N) the database is emptied, R runs of P passes are
started, N drivers are started and wait until all are ready, then all are told to
go at once; the time is from "go" to the last driver's "done" (every run done).

* ``io`` mode: each pass's ``fetch`` step awaits ``asyncio.sleep(--sleep-ms)``
  (a simulated external call, 20 ms by default) and its ``apply`` step inserts
  one row into the ``effects`` table;
* ``cpu`` mode: the same two steps without the sleep (trivial bodies).

CPU time is measured per measurement window: each driver reports its own
``process_time`` (all threads); on Postgres the parent reads ``utime + stime``
of the drivers' server backends from ``/proc/<pid>/stat`` (found through
``pg_stat_activity.application_name``); ``/proc/stat`` gives the whole machine's
busy CPU over the window (other people's work included).

Correctness is checked after every measurement: each (run, pass) has exactly one
row in ``effects`` (which has no unique key), every run is ``done`` at cursor P
with an empty ledger and no lease, and the summed reports show no superseded,
retrying or failed pass.

Takeover: 4 drivers with ``lease_ms = 1000`` and a 100 ms ``fetch`` step; one is
SIGKILLed while it announces it is in that step; the parent polls the run's row
until another driver's lease is on it. ``light``: 4 runs of endless passes
(always a free driver); ``backlog``: more runs than drivers (the expired run is
due at its expiry, so it queues behind every run that became due earlier).

Results: ``benchmarks/results/scale-<date>.json`` (``-quick`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Runnable as a plain script from a checkout, installed or not.
    sys.path.insert(0, str(ROOT))

from sqlalchemy import make_url, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402

import jobrun  # noqa: E402
from jobrun._core.formats import parse_instant  # noqa: E402

CHILD = Path(__file__).with_name("scale_child.py")
DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/jobrun_scale"
MODULE, JOB = "scale", "walk"
APP_PREFIX = "jobrun-scale-"
COUNTED = ("attempted", "advanced", "completed", "retrying", "failed", "superseded")
CLK_TCK = os.sysconf("SC_CLK_TCK")
EFFECTS_DDL = "CREATE TABLE effects (run_id TEXT NOT NULL, pass_no INTEGER NOT NULL, driver TEXT)"
ENDLESS_PASSES = 1_000_000


# --------------------------------------------------------------------------- machine


def loadavg() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def system_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from the first line of /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def process_ticks(pid: int) -> int | None:
    """utime + stime of one process, in clock ticks (None if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            raw = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; everything after its ')' is fixed.
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def machine() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    import sqlalchemy

    return {
        "nproc": os.cpu_count(),
        "nproc_command": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "platform": platform.platform(),
        "git_commit": commit,
    }


# --------------------------------------------------------------------------- children


class Child:
    """A driver process and the JSON lines it prints."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.name = name
        self.process = process
        self.stderr_path = stderr
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, name: str, url: str, logs: Path, options: list[str]) -> Child:
        stderr = logs / f"{name}.stderr"
        with stderr.open("w") as sink:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(CHILD),
                "--url",
                url,
                "--name",
                name,
                *options,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=sink,
            )
        return cls(name, process, stderr)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                item = {"event": "garbage", "line": line.decode(errors="replace")}
            item["seen"] = time.time()
            self.events.append(item)
            self.changed.set()
        self.changed.set()

    async def wait_for(
        self,
        event: str,
        within_s: float,
        where: Callable[[dict[str, Any]], bool] = lambda _: True,
        start: int = 0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        index = start
        while True:
            while index < len(self.events):
                item = self.events[index]
                index += 1
                if item["event"] == event and where(item):
                    return item
            if self.reader.done():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                break
        raise RuntimeError(
            f"driver {self.name}: no {event!r} within {within_s} s "
            f"(exit code {self.process.returncode}); last events {self.events[-3:]}; "
            f"stderr: {self.stderr_path.read_text()[-2000:]}"
        )

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{line}\n".encode())
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def finish(self, within_s: float = 30) -> int | None:
        if self.process.returncode is None:
            await self.send("exit")
            try:
                await asyncio.wait_for(self.process.wait(), within_s)
            except TimeoutError:
                self.kill()
                await self.process.wait()
        await self.reader
        return self.process.returncode

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)


async def stop_all(children: list[Child]) -> None:
    for child in children:
        child.kill()
    for child in children:
        await child.process.wait()
        await child.reader


# --------------------------------------------------------------------------- databases


class Backend:
    """One database the drivers share: set-up, emptying, seeding, reading back."""

    name: str
    url: str

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.engine: AsyncEngine | None = None

    async def prepare(self) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None

    async def backend_pids(self) -> dict[str, int]:
        return {}

    async def seed(self, runs: int, prefix: str = "r") -> list[str]:
        assert self.engine is not None
        store = jobrun.SqlJobRunStore(self.engine)
        ids: list[str] = []
        batch = 16 if self.name == "postgres" else 1
        for first in range(0, runs, batch):
            started = await asyncio.gather(
                *(
                    jobrun.start_job_run(
                        store, module_id=MODULE, job=JOB, instance=f"{prefix}{index:06d}"
                    )
                    for index in range(first, min(runs, first + batch))
                )
            )
            ids.extend(run.id for run in started)
        return ids

    async def verify(self, runs: int, passes: int) -> dict[str, Any]:
        """Every (run, pass) effect exactly once, every run done, no lease, no ledger."""
        assert self.engine is not None
        async with self.engine.connect() as connection:
            effect_rows = (
                await connection.execute(
                    text("SELECT run_id, pass_no, COUNT(*) AS n FROM effects GROUP BY 1, 2")
                )
            ).all()
            statuses: dict[str, int] = dict(
                (
                    await connection.execute(
                        text("SELECT status, COUNT(*) FROM _substrat_job_runs GROUP BY status")
                    )
                ).all()
            )
            bad_rows = (
                await connection.execute(
                    text(
                        "SELECT COUNT(*) FROM _substrat_job_runs WHERE status <> 'done' "
                        "OR cursor <> :cursor OR lease_owner IS NOT NULL "
                        "OR lease_takeovers <> 0 OR attempts <> 0"
                    ),
                    {"cursor": json.dumps(passes)},
                )
            ).scalar_one()
            ledger = (
                await connection.execute(text("SELECT COUNT(*) FROM _substrat_job_steps"))
            ).scalar_one()
        per_pass = Counter(int(row.n) for row in effect_rows)
        return {
            "runs_done": int(statuses.get("done", 0)),
            "runs_not_done": int(sum(n for s, n in statuses.items() if s != "done")),
            "rows_off": int(bad_rows),
            "ledger_rows": int(ledger),
            "passes_with_effect": len(effect_rows),
            "passes_expected": runs * passes,
            "passes_run_twice_or_more": sum(n for count, n in per_pass.items() if count > 1),
            "exactly_once": (
                len(effect_rows) == runs * passes
                and set(per_pass) == {1}
                and int(statuses.get("done", 0)) == runs
                and not bad_rows
                and not ledger
            ),
        }


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, workdir: Path, url: str) -> None:
        super().__init__(workdir)
        self.url = url

    async def prepare(self) -> None:
        target = make_url(self.url)
        admin = create_async_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            async with admin.connect() as connection:
                exists = (
                    await connection.execute(
                        text("SELECT 1 FROM pg_database WHERE datname = :name"),
                        {"name": target.database},
                    )
                ).first()
                if exists is None:
                    await connection.execute(text(f'CREATE DATABASE "{target.database}"'))
        finally:
            await admin.dispose()
        self.engine = create_async_engine(self.url)
        await jobrun.upgrade(self.engine)
        async with self.engine.begin() as connection:
            await connection.execute(text("DROP TABLE IF EXISTS effects"))
            await connection.execute(text(EFFECTS_DDL))

    async def reset(self) -> None:
        assert self.engine is not None
        async with self.engine.begin() as connection:
            await connection.execute(
                text("TRUNCATE effects, _substrat_job_steps, _substrat_job_runs")
            )

    async def settle(self) -> None:
        """Fresh statistics after seeding, so every measurement starts alike."""
        assert self.engine is not None
        async with self.engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(text("VACUUM ANALYZE _substrat_job_runs"))

    async def backend_pids(self) -> dict[str, int]:
        assert self.engine is not None
        async with self.engine.connect() as connection:
            rows = (
                await connection.execute(
                    text(
                        "SELECT pid, application_name FROM pg_stat_activity "
                        "WHERE datname = current_database() AND application_name LIKE :prefix"
                    ),
                    {"prefix": APP_PREFIX + "%"},
                )
            ).all()
        return {f"{row.application_name}:{row.pid}": int(row.pid) for row in rows}

    async def version(self) -> str:
        assert self.engine is not None
        async with self.engine.connect() as connection:
            return str((await connection.execute(text("SHOW server_version"))).scalar_one())


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.template = workdir / "template.sqlite"
        self.counter = 0
        self.url = ""

    async def prepare(self) -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{self.template}")
        try:
            await jobrun.upgrade(engine)
            async with engine.begin() as connection:
                await connection.execute(text(EFFECTS_DDL))
        finally:
            await engine.dispose()

    async def reset(self) -> None:
        await self.close()
        self.counter += 1
        path = self.workdir / f"scale-{self.counter}.sqlite"
        shutil.copyfile(self.template, path)
        self.url = f"sqlite+aiosqlite:///{path}"
        self.engine = create_async_engine(self.url)

    async def settle(self) -> None:
        return None


# --------------------------------------------------------------------------- measurements


def child_url(backend: Backend) -> str:
    return backend.url


async def start_fleet(backend: Backend, count: int, options: list[str], tag: str) -> list[Child]:
    children: list[Child] = []
    try:
        for index in range(count):
            children.append(
                await Child.start(
                    f"{APP_PREFIX}{tag}-{index}", child_url(backend), backend.workdir, options
                )
            )
        for child in children:
            await child.wait_for("ready", 120)
    except BaseException:
        await stop_all(children)
        raise
    return children


async def measure_drain(
    backend: Backend, mode: str, drivers: int, args: argparse.Namespace, runs: int
) -> dict[str, Any]:
    await backend.reset()
    await backend.seed(runs)
    if isinstance(backend, PostgresBackend):
        await backend.settle()
    options = [
        "--mode",
        mode,
        "--sleep-ms",
        str(args.sleep_ms),
        "--io-steps",
        str(args.io_steps),
        "--passes",
        str(args.passes),
        "--max-passes",
        str(args.max_passes),
        "--deadline-s",
        str(args.deadline_s),
    ]
    if args.lease_ms is not None:
        options += ["--lease-ms", str(args.lease_ms)]
    children = await start_fleet(backend, drivers, options, f"{mode}{drivers}")
    try:
        pids_before = await backend.backend_pids()
        ticks_before = {key: process_ticks(pid) for key, pid in pids_before.items()}
        load_before = loadavg()
        system_before = system_ticks()
        began = time.time()
        for child in children:
            await child.send("go")
        dones = [await child.wait_for("done", args.deadline_s + 60) for child in children]
        ended = max(done["t"] for done in dones)
        system_after = system_ticks()
        pids_after = await backend.backend_pids()
        ticks_after = {key: process_ticks(pid) for key, pid in pids_after.items()}
    finally:
        codes = [await child.finish() for child in children]
    elapsed = ended - began
    total_passes = runs * args.passes
    totals = {name: sum(int(done[name]) for done in dones) for name in COUNTED}
    driver_cpu_s = sum(float(done["cpu_s"]) for done in dones)
    pg_ticks = 0
    for key, after in ticks_after.items():
        if after is not None:
            pg_ticks += after - (ticks_before.get(key) or 0)
    busy = (system_after[0] - system_before[0]) / CLK_TCK
    correctness = await backend.verify(runs, args.passes)
    correctness["superseded"] = totals["superseded"]
    correctness["retrying_or_failed"] = totals["retrying"] + totals["failed"]
    correctness["errors"] = [error for done in dones for error in done["errors"]][:10]
    correctness["timed_out"] = any(done["timed_out"] for done in dones)
    correctness["exit_codes"] = codes
    correctness["ok"] = bool(
        correctness["exactly_once"]
        and totals["superseded"] == 0
        and correctness["retrying_or_failed"] == 0
        and totals["completed"] == runs
        and not correctness["timed_out"]
        and not correctness["errors"]
    )
    return {
        "backend": backend.name,
        "mode": mode,
        "drivers": drivers,
        "runs": runs,
        "passes": args.passes,
        "elapsed_s": round(elapsed, 3),
        "passes_per_s": round(total_passes / elapsed, 1),
        "driver_cpu_ms_per_pass": round(driver_cpu_s * 1000 / total_passes, 3),
        "pg_backend_cpu_ms_per_pass": (
            round(pg_ticks / CLK_TCK * 1000 / total_passes, 3)
            if isinstance(backend, PostgresBackend)
            else None
        ),
        "pg_backends_seen": len(ticks_after) if isinstance(backend, PostgresBackend) else None,
        "machine_busy_cores": round(busy / elapsed, 2),
        # Cores the drivers and their Postgres backends used, of the machine's nproc.
        "jobrun_cores": round((driver_cpu_s + pg_ticks / CLK_TCK) / elapsed, 2),
        "machine_cpu_ms_per_pass": round(busy * 1000 / total_passes, 3),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "reports": totals,
        "claims_per_driver": [int(done["attempted"]) for done in dones],
        "idle_polls": sum(int(done["idle_polls"]) for done in dones),
        "correctness": correctness,
    }


async def measure_takeover(
    backend: Backend, args: argparse.Namespace, scenario: str, runs: int, passes: int
) -> dict[str, Any]:
    """SIGKILL one of 4 drivers inside a step; time until another driver holds its run."""
    await backend.reset()
    await backend.seed(runs, prefix="t")
    lease_ms = args.takeover_lease_ms
    options = [
        "--mode",
        "io",
        "--sleep-ms",
        str(args.takeover_sleep_ms),
        "--passes",
        str(passes),
        "--lease-ms",
        str(lease_ms),
        "--announce",
        "--deadline-s",
        "120",
    ]
    children = await start_fleet(backend, 4, options, f"takeover-{scenario}")
    victim = children[0]
    assert backend.engine is not None
    query = text(
        "SELECT id, lease_owner, lease_driver, lease_began_at, next_attempt_at, lease_takeovers "
        "FROM _substrat_job_runs WHERE "
    )
    try:
        for child in children:
            await child.send("go")
        # Let the fleet settle into its rhythm, then kill the victim inside its waiting step.
        await asyncio.sleep(args.takeover_warmup_s)
        mark = len(victim.events)
        announced = await victim.wait_for("step", 30, start=mark)
        victim.kill()
        killed_at = time.time()
        async with backend.engine.connect() as connection:
            held = (
                await connection.execute(
                    text(query.text + "lease_driver = :driver"), {"driver": victim.name}
                )
            ).first()
        await victim.process.wait()
        if held is None:
            return {"scenario": scenario, "valid": False, "why": "the victim held no lease"}
        expiry_after_kill = parse_instant(held.next_attempt_at).timestamp() - killed_at
        observed_at = None
        row = held
        deadline = time.monotonic() + args.takeover_timeout_s
        while time.monotonic() < deadline:
            async with backend.engine.connect() as connection:
                row = (
                    await connection.execute(text(query.text + "id = :id"), {"id": held.id})
                ).one()
            if row.lease_owner is not None and row.lease_owner != held.lease_owner:
                observed_at = time.time()
                break
            if row.lease_owner is None and row.lease_driver is None and row.lease_takeovers:
                observed_at = time.time()  # claimed and already committed between polls
                break
            await asyncio.sleep(args.takeover_poll_s)
        result: dict[str, Any] = {
            "scenario": scenario,
            "valid": True,
            "runs": runs,
            "passes": passes,
            "lease_ms": lease_ms,
            "step_sleep_ms": args.takeover_sleep_ms,
            "run": held.id,
            "victim_step_pass": announced["pass_no"],
            "kill_after_announce_ms": round((killed_at - announced["seen"]) * 1000, 1),
            "expiry_after_kill_s": round(expiry_after_kill, 3),
            "loadavg": loadavg(),
        }
        if observed_at is None:
            result |= {"taken_over": False, "waited_s": args.takeover_timeout_s}
        else:
            result |= {
                "taken_over": True,
                "new_driver": row.lease_driver,
                "latency_observed_s": round(observed_at - killed_at, 3),
                "latency_claim_s": (
                    round(parse_instant(row.lease_began_at).timestamp() - killed_at, 3)
                    if row.lease_began_at
                    else None
                ),
            }
        if scenario == "backlog":
            # The survivors finish the drain: the run killed mid-pass finishes too.
            dones = [await child.wait_for("done", 120) for child in children[1:]]
            result["survivor_superseded"] = sum(int(done["superseded"]) for done in dones)
            check = await backend.verify(runs, passes)
            result["all_done"] = check["runs_done"] == runs
            result["passes_run_twice_or_more"] = check["passes_run_twice_or_more"]
        return result
    finally:
        await stop_all(children)


# --------------------------------------------------------------------------- report


def medians(results: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Per (backend, mode, N): the median over repeats of passes/s and the CPU figures."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for item in results:
        groups.setdefault((item["backend"], item["mode"], item["drivers"]), []).append(item)
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for key, items in groups.items():
        pg = [i["pg_backend_cpu_ms_per_pass"] for i in items if i["pg_backend_cpu_ms_per_pass"]]
        out[key] = {
            "samples": len(items),
            "passes_per_s": round(statistics.median(i["passes_per_s"] for i in items), 1),
            "passes_per_s_all": [i["passes_per_s"] for i in items],
            "driver_cpu_ms_per_pass": round(
                statistics.median(i["driver_cpu_ms_per_pass"] for i in items), 3
            ),
            "pg_backend_cpu_ms_per_pass": round(statistics.median(pg), 3) if pg else None,
            "jobrun_cores": round(statistics.median(i["jobrun_cores"] for i in items), 2),
            "machine_busy_cores": round(
                statistics.median(i["machine_busy_cores"] for i in items), 2
            ),
            "loadavg_1m": [i["loadavg_before"][0] for i in items],
            "all_ok": all(i["correctness"]["ok"] for i in items),
        }
    for (backend, mode, _count), entry in out.items():
        one = out.get((backend, mode, 1))
        entry["speedup"] = round(entry["passes_per_s"] / one["passes_per_s"], 2) if one else None
    return out


def add_speedups(results: list[dict[str, Any]]) -> None:
    """Each sample's speedup against the median N=1 rate of its backend and mode."""
    table = medians(results)
    for item in results:
        one = table.get((item["backend"], item["mode"], 1))
        item["speedup"] = round(item["passes_per_s"] / one["passes_per_s"], 2) if one else None


def print_table(results: list[dict[str, Any]], takeovers: list[dict[str, Any]]) -> None:
    header = (
        f"{'backend':8} {'mode':4} {'N':>2} {'runs':>5} {'s':>7} {'passes/s':>9} {'speedup':>7} "
        f"{'drv ms/p':>8} {'pg ms/p':>8} {'busy':>5} {'load':>5} {'ok':>3}  claims/driver"
    )
    print(header)
    print("-" * len(header))
    for item in results:
        pg = item["pg_backend_cpu_ms_per_pass"]
        print(
            f"{item['backend']:8} {item['mode']:4} {item['drivers']:>2} {item['runs']:>5} "
            f"{item['elapsed_s']:>7.2f} {item['passes_per_s']:>9.1f} "
            f"{(item['speedup'] or 0):>7.2f} {item['driver_cpu_ms_per_pass']:>8.2f} "
            f"{'-' if pg is None else f'{pg:.2f}':>8} {item['machine_busy_cores']:>5.2f} "
            f"{item['loadavg_before'][0]:>5.1f} {'yes' if item['correctness']['ok'] else 'NO':>3}"
            f"  {item['claims_per_driver']}"
        )
    for item in takeovers:
        if not item.get("valid"):
            print(f"takeover {item['scenario']}: invalid ({item.get('why')})")
            continue
        print(
            f"takeover {item['backend']} {item['scenario']} ({item['runs']} runs, lease "
            f"{item['lease_ms']} ms): expiry {item['expiry_after_kill_s']:.3f} s after the kill; "
            f"claimed {item.get('latency_claim_s')} s, seen "
            f"{item.get('latency_observed_s')} s after the kill"
        )


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for (backend, mode, count), entry in medians(results).items():
        summary.setdefault(f"{backend}/{mode}", {})[str(count)] = entry
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print()
    header = (
        f"{'curve':14} {'N':>2} {'passes/s':>9} {'speedup':>7} {'drv ms/p':>8} "
        f"{'pg ms/p':>8} {'ours':>5} {'busy':>5}  samples (passes/s), load 1m"
    )
    print(header)
    print("-" * len(header))
    for curve, points in summary.items():
        for count, entry in points.items():
            pg = entry["pg_backend_cpu_ms_per_pass"]
            print(
                f"{curve:14} {count:>2} {entry['passes_per_s']:>9.1f} "
                f"{(entry['speedup'] or 0):>7.2f} {entry['driver_cpu_ms_per_pass']:>8.2f} "
                f"{'-' if pg is None else f'{pg:.2f}':>8} {entry['jobrun_cores']:>5.2f} "
                f"{entry['machine_busy_cores']:>5.2f}  {entry['passes_per_s_all']}, "
                f"{entry['loadavg_1m']}"
            )


# --------------------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny SQLite-only smoke run")
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--modes", default="io,cpu")
    parser.add_argument("--drivers", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=2000, help="runs per Postgres measurement")
    parser.add_argument("--sqlite-runs", type=int, default=400, help="runs per SQLite one")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--max-passes", type=int, default=1, help="passes per claim")
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="io mode: the wait")
    parser.add_argument("--io-steps", type=int, choices=(1, 2), default=1)
    parser.add_argument("--lease-ms", type=int, default=None, help="default: jobrun's")
    parser.add_argument("--takeover", default="light,backlog", help="scenarios, or 'none'")
    parser.add_argument("--takeover-trials", type=int, default=3)
    parser.add_argument("--takeover-backends", default="postgres")
    parser.add_argument("--takeover-lease-ms", type=int, default=1000)
    parser.add_argument("--takeover-sleep-ms", type=float, default=100.0)
    parser.add_argument("--takeover-backlog-runs", type=int, default=60)
    parser.add_argument("--takeover-warmup-s", type=float, default=1.0)
    parser.add_argument("--takeover-poll-s", type=float, default=0.005)
    parser.add_argument("--takeover-timeout-s", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=1, help="sweeps; medians reported")
    parser.add_argument("--deadline-s", type=float, default=1800.0)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        defaults = {
            "backends": "sqlite",
            "drivers": "1,2",
            "runs": 6,
            "sqlite_runs": 6,
            "passes": 2,
            "sleep_ms": 5.0,
            "takeover": "none",
            "takeover_backends": "sqlite",
            "takeover_trials": 1,
            "takeover_warmup_s": 0.3,
            "takeover_backlog_runs": 8,
        }
        for name, value in defaults.items():
            if parser.get_default(name) == getattr(args, name):
                setattr(args, name, value)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = dt.datetime.now(dt.UTC)
    meta: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "argv": sys.argv,
        "started_at": started.isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
        **machine(),
        "settings": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in vars(args).items()
        },
    }
    backends_wanted = [name for name in args.backends.split(",") if name]
    modes = [mode for mode in args.modes.split(",") if mode]
    drivers = [int(value) for value in args.drivers.split(",") if value]
    takeover_scenarios = [] if args.takeover == "none" else args.takeover.split(",")
    takeover_backends = args.takeover_backends.split(",")
    results: list[dict[str, Any]] = []
    takeovers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jobrun-scale-") as tmp:
        for name in backends_wanted:
            workdir = Path(tmp) / name
            workdir.mkdir()
            backend: Backend = (
                PostgresBackend(workdir, args.postgres_url)
                if name == "postgres"
                else SqliteBackend(workdir)
            )
            await backend.prepare()
            if isinstance(backend, PostgresBackend):
                meta["postgres"] = await backend.version()
            runs = args.runs if name == "postgres" else args.sqlite_runs
            try:
                for repeat in range(args.repeat):
                    # Every other sweep runs N downwards, so drift in the load spreads out.
                    order = drivers if repeat % 2 == 0 else drivers[::-1]
                    for mode, count in ((mode, count) for mode in modes for count in order):
                        item = await measure_drain(backend, mode, count, args, runs)
                        results.append(item)
                        print(
                            f"{name} {mode} N={count}: {item['passes_per_s']} passes/s "
                            f"in {item['elapsed_s']} s, ok={item['correctness']['ok']}, "
                            f"load {item['loadavg_before']}",
                            flush=True,
                        )
                if name in takeover_backends:
                    for scenario in takeover_scenarios:
                        light = scenario == "light"
                        for _trial in range(args.takeover_trials if light else 1):
                            item = await measure_takeover(
                                backend,
                                args,
                                scenario,
                                4 if light else args.takeover_backlog_runs,
                                ENDLESS_PASSES if light else args.passes,
                            )
                            item["backend"] = name
                            takeovers.append(item)
                            print(f"takeover {name}: {item}", flush=True)
            finally:
                await backend.close()
    add_speedups(results)
    meta["loadavg_end"] = loadavg()
    meta["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    light = [
        item["latency_claim_s"]
        for item in takeovers
        if item.get("scenario") == "light" and item.get("latency_claim_s") is not None
    ]
    return {
        "meta": meta,
        "summary": summarize(results),
        "drains": results,
        "takeover": takeovers,
        "takeover_light_median_s": statistics.median(light) if light else None,
        "all_correct": all(item["correctness"]["ok"] for item in results),
    }


def main(argv: list[str]) -> int:
    args = parse(argv)
    output = asyncio.run(run(args))
    print()
    print_table(output["drains"], output["takeover"])
    print_summary(output["summary"])
    out = args.out or (
        ROOT
        / "benchmarks"
        / "results"
        / f"scale-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(output, indent=2) + "\n")
    print(f"\nresults: {out}")
    return 0 if output["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
