"""The faults that need no throwaway cluster or mount, and the list of every scenario.

Each fault waits until a driver is inside a step body of one of its run's
middle passes, then strikes. ``quick`` marks the bounded set that CI runs
(``tests/processes/test_chaos.py``).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import uuid

from sqlalchemy import make_url

from tests.chaos.stage import LEASE_MS, Fault, Stage, admin, url_with
from tests.faultproxy import ThreadedProxy


class KillHolder(Fault):
    name, quick = "kill -9 holder mid-step", True

    async def inject(self, stage: Stage) -> None:
        victim, event = await stage.victim_body()
        victim.process.send_signal(signal.SIGKILL)
        stage.deaths[victim.process.pid] = stage.resume_from_ns = time.monotonic_ns()
        stage.affected_runs = {event["run"]}


class StopHolder(Fault):
    name, quick = "SIGSTOP holder past lease, SIGCONT", True
    stopped_s = LEASE_MS / 1000 + 2

    async def inject(self, stage: Stage) -> None:
        victim, event = await stage.victim_body()
        stop_ns = time.monotonic_ns()
        victim.process.send_signal(signal.SIGSTOP)
        try:
            # sleep: the fault's length: the victim stays stopped past its lease
            await asyncio.sleep(self.stopped_s)
        finally:
            victim.process.send_signal(signal.SIGCONT)
            stage.pauses[victim.process.pid] = [(stop_ns, time.monotonic_ns())]
        stage.resume_from_ns, stage.affected_runs = stop_ns, {event["run"]}
        stage.notes.append(f"stopped {self.stopped_s:.0f} s; resume counted from SIGSTOP")


_PRESENCE_KEY = re.compile(r" presence=([0-9]+)\]$")


async def presence_backend(stage: Stage, run_id: str) -> int | None:
    """The server pid of the session holding the presence lock named by the run's lease."""
    quoted = run_id.replace("'", "''")
    (driver,) = await admin(
        stage.url, f"SELECT lease_driver FROM _substrat_job_runs WHERE id = '{quoted}'"
    )
    found = _PRESENCE_KEY.search(driver or "")
    if found is None:
        return None
    key = int(found.group(1))
    (pid,) = await admin(
        stage.url,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        f"AND ((classid::bigint << 32) | objid::bigint) = {key} "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return int(pid) if pid is not None else None


class TerminatePresence(Fault):
    name, quick, backends = "pg_terminate_backend(presence)", True, ("postgres",)

    async def inject(self, stage: Stage) -> None:
        _victim, event = await stage.victim_body()
        backend_pid = await presence_backend(stage, event["run"])
        if backend_pid is None:
            raise AssertionError("the holder's presence lock was not found in pg_locks")
        (ended,) = await admin(stage.url, f"SELECT pg_terminate_backend({backend_pid})")
        stage.resume_from_ns, stage.affected_runs = time.monotonic_ns(), {event["run"]}
        stage.notes.append(f"presence session {backend_pid} terminated: {ended}")


class IdleSessionTimeout(Fault):
    """``idle_session_timeout`` on the scenario's database or on a role made for it.

    Set before the drivers connect (a session keeps the value it started with),
    for the whole scenario; reset and dropped at the end.
    """

    backends = ("postgres",)
    passes = 12  # runs of about 6 s, so that even a 5 s timeout finds an idle session

    def __init__(self, seconds: int, on: str) -> None:
        self.seconds, self.on = seconds, on
        self.name = f"idle_session_timeout {seconds} s ({on})"
        self.quick = seconds == 1 and on == "database"

    async def before_database(self, stage: Stage) -> None:
        if self.on != "role":
            return
        stage.owner = f"jobrun_chaos_{uuid.uuid4().hex[:8]}"
        await admin(stage.server_url, f'CREATE ROLE "{stage.owner}" LOGIN')
        stage.stack.push_async_callback(admin, stage.server_url, f'DROP ROLE "{stage.owner}"')

    async def before_drivers(self, stage: Stage) -> None:
        setting = f"idle_session_timeout = '{self.seconds}s'"
        on_role = self.on == "role"
        target = f'ROLE "{stage.owner}"' if on_role else f'DATABASE "{stage.database}"'
        await admin(stage.server_url, f"ALTER {target} SET {setting}")
        reset = f"ALTER {target} RESET idle_session_timeout"
        stage.stack.push_async_callback(admin, stage.server_url, reset)


def _through(proxy: ThreadedProxy, url: str) -> str:
    return url_with(url, host="127.0.0.1", port=proxy.port)


def _proxy_for(stage: Stage) -> ThreadedProxy:
    server = make_url(stage.server_url)
    proxy = ThreadedProxy(server.host or "127.0.0.1", server.port or 5432)
    stage.stack.callback(proxy.close)
    return proxy


class ProxyCut(Fault):
    name, quick, backends = "network cut (every driver via proxy)", True, ("postgres",)

    async def before_drivers(self, stage: Stage) -> None:
        self.proxy = _proxy_for(stage)
        stage.driver_urls = {index: _through(self.proxy, stage.url) for index in range(8)}

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        cut = await asyncio.to_thread(self.proxy.cut)
        stage.resume_from_ns = time.monotonic_ns()
        stage.notes.append(f"{cut} connections reset")


class ProxyBlackhole(Fault):
    name, backends = "network blackholed 5 s (one driver via proxy)", ("postgres",)
    blackhole_s, first_driver_alone = 5.0, True

    async def before_drivers(self, stage: Stage) -> None:
        self.proxy = _proxy_for(stage)
        stage.driver_urls = {0: _through(self.proxy, stage.url)}

    async def inject(self, stage: Stage) -> None:
        _victim, event = await stage.victim_body(only=stage.children[0])
        await asyncio.to_thread(self.proxy.blackhole)
        # The others take the run over during the partition: resume counts from its start.
        stage.resume_from_ns, stage.affected_runs = time.monotonic_ns(), {event["run"]}
        try:
            # sleep: the partition's length, past the lease
            await asyncio.sleep(self.blackhole_s)
        finally:
            await asyncio.to_thread(self.proxy.heal)
        stage.notes.append("resume counted from the blackhole's start")


class BlackholedConnection(Fault):
    """One pool connection goes silent at the victim's step write (socket kept open,
    nothing forwarded), the rest of the network is fine: renewals on other
    connections go through (issue 31: the run stayed stuck until cancelled).

    Postgres only: SQLite has no network, and its counterpart (the connection's
    thread blocked inside a call) cannot be caused in a driver process from
    outside; ``tests/contract/test_stuck_calls.py`` injects it in process."""

    name, quick, backends = "one connection black-holed at a step write", True, ("postgres",)

    async def before_drivers(self, stage: Stage) -> None:
        self.proxy = _proxy_for(stage)
        stage.driver_urls = {index: _through(self.proxy, stage.url) for index in range(8)}

    async def inject(self, stage: Stage) -> None:
        _victim, event = await stage.victim_body()
        markers = (event["run"].encode(), event["step"].encode())
        await asyncio.to_thread(self.proxy.blackhole_when, *markers)
        stage.resume_from_ns, stage.affected_runs = time.monotonic_ns(), {event["run"]}
        stage.notes.append("resume counted from the body before the silenced write")


class DroppedChunks(Fault):
    """Chunks lost on every driver's connections for a while, then the path heals
    (issue 31: 1% for 30 s left 3 of 3 runs stuck after the heal)."""

    backends = ("postgres",)

    def __init__(self, percent: float = 1.0, seconds: float = 30.0) -> None:
        self.percent, self.seconds = percent, seconds
        self.name = f"{percent:g}% of chunks dropped {seconds:.0f} s, then healed"
        self.passes = 12 if seconds > 10 else 6  # runs long enough to outlast the fault
        self.deadline_s = 60 + seconds

    async def before_drivers(self, stage: Stage) -> None:
        self.proxy = _proxy_for(stage)
        stage.driver_urls = {index: _through(self.proxy, stage.url) for index in range(8)}

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        await asyncio.to_thread(self.proxy.drop, self.percent / 100, 31)
        try:
            # sleep: the lossy spell's length
            await asyncio.sleep(self.seconds)
        finally:
            await asyncio.to_thread(self.proxy.heal)
        stage.resume_from_ns = time.monotonic_ns()
        dropped = self.proxy.proxy.dropped
        stage.notes.append(f"{dropped} chunks dropped; resume counted from the heal")


_HOLD_LOCK = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
"""


class SqliteLocked(Fault):
    backends = ("sqlite",)
    passes = 6

    def __init__(self, seconds: float, quick: bool = False) -> None:
        self.seconds, self.quick = seconds, quick
        self.name = f"SQLite locked {seconds:.0f} s (BEGIN EXCLUSIVE)"
        self.deadline_s = 60 + seconds

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        path = make_url(stage.url).database
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD_LOCK, str(path), str(self.seconds),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            await asyncio.wait_for(holder.stdout.readline(), 60)
            await asyncio.wait_for(holder.wait(), self.seconds + 30)
        finally:
            if holder.returncode is None:
                holder.kill()
                await holder.wait()
        stage.resume_from_ns = time.monotonic_ns()


def all_scenarios() -> list[tuple[Fault, str]]:
    """Every (fault, backend) pair, the quick ones first."""
    from tests.chaos.clock_steps import clock_steps
    from tests.chaos.cluster import DiskFull, PostgresRestart, SqliteDiskFull
    from tests.chaos.failover import Failover, SplitBrain
    from tests.chaos.idle_survivor import IdleSurvivor

    faults: list[Fault] = [
        KillHolder(),
        IdleSurvivor(),
        IdleSurvivor(elsewhere=True),
        StopHolder(),
        TerminatePresence(),
        IdleSessionTimeout(1, "database"),
        ProxyCut(),
        BlackholedConnection(),
        SqliteLocked(10, quick=True),
        *(IdleSessionTimeout(seconds, on) for on in ("database", "role") for seconds in (1, 2, 5)),
        ProxyBlackhole(),
        DroppedChunks(1.0, 30.0),
        DroppedChunks(5.0, 10.0),
        SqliteLocked(30),
        PostgresRestart("fast"),
        PostgresRestart("immediate"),
        PostgresRestart("outage", outage_s=15),
        DiskFull(),
        SqliteDiskFull(),
        *clock_steps(),
        Failover(),
        Failover(lag_s=1.5),
        Failover(lag_s=1.5, synchronous=True),
        SplitBrain(),
    ]
    pairs, seen = [], set()
    for fault in faults:
        for backend in fault.backends:
            if (fault.name, backend) not in seen:
                seen.add((fault.name, backend))
                pairs.append((fault, backend))
    return pairs
