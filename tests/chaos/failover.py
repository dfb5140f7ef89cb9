"""Failover (issue 31 item 4): a throwaway primary and streaming replica, the primary lost.

The pair (:func:`replicated_pair`): a primary made by ``cluster.new_cluster``,
and a replica made with ``pg_basebackup -R`` from it into a cluster of its own;
both on free ports, both dropped at the end whatever happens. The drivers reach the
primary through a TCP proxy (``tests/faultproxy.py``) that the fault repoints to
the replica once it is promoted, as a virtual IP or a DNS name would be.

* :class:`Failover` kills every process of the primary at once (the machine
  died), promotes the replica and repoints the proxy. With ``lag_s`` the
  primary's WAL sender is stopped that long before the kill, so the replica
  misses the last ``lag_s`` of commits (asynchronous replication behind by that
  much); with ``synchronous`` the primary waits for the replica at each commit
  (``synchronous_standby_names``), so a commit the replica missed was never
  acknowledged.
* :class:`SplitBrain` promotes the replica while the old primary goes on
  accepting writes (nothing fenced it): two drivers keep working on the old
  primary, a third works on the promoted one.

The referee's ``acknowledged_repeats`` counts the steps that were recorded and
run again afterwards: acknowledged work the promoted server had not received.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from datetime import datetime
from pathlib import Path

from sqlalchemy import make_url, select
from sqlalchemy.ext.asyncio import create_async_engine

from jobrun._core.leases.holders import parse_holder
from jobrun.sql.schema import job_runs
from tests.chaos.cluster import VERSION, data_directory, new_cluster, run_command
from tests.chaos.stage import Fault, Stage, admin, url_with
from tests.faultproxy import ThreadedProxy


def _as_postgres(*command: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command]


def url_port(url: str) -> int:
    return int(make_url(url).port or 5432)


async def replicated_pair(stage: Stage, synchronous: bool) -> tuple[str, str, int]:
    """A primary and a streaming replica of it: their cluster names and the replica's
    port. ``stage.server_url`` points at the primary."""
    primary, primary_port = await new_cluster(stage, "primary")
    stage.server_url = f"postgresql+asyncpg://postgres@127.0.0.1:{primary_port}/postgres"
    replica, replica_port = await new_cluster(stage, "replica", start=False)
    data = data_directory(replica)
    # Its own files make way for the primary's (the directory keeps its owner).
    for entry in data.iterdir():
        await asyncio.to_thread(shutil.rmtree if entry.is_dir() else os.remove, entry)
    backup = ["pg_basebackup", "-h", "127.0.0.1", "-p", str(primary_port), "-U", "postgres"]
    backup += ["-D", str(data), "-R", "-X", "stream", "-c", "fast"]
    await asyncio.to_thread(run_command, *_as_postgres(*backup))
    await asyncio.to_thread(run_command, "pg_ctlcluster", VERSION, replica, "start")
    stage.notes.append(f"primary {primary}, replica {replica} (pg_basebackup -R)")
    if synchronous:
        await admin(
            stage.server_url,
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "SELECT pg_reload_conf()",
        )
    await _until_streaming(stage.server_url, "sync" if synchronous else "async")
    return primary, replica, replica_port


async def _until_streaming(primary_url: str, state: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (found,) = await admin(
            primary_url, "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
        )
        if found == state:
            return
        # sleep: a poll for the replica to stream
        await asyncio.sleep(0.1)
    raise AssertionError(f"the replica did not stream ({state}) within 60 s")


def _cluster_pids(cluster: str) -> tuple[int, list[int]]:
    """The postmaster of ``cluster`` and its children."""
    postmaster = int((data_directory(cluster) / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(entry.name))
    return postmaster, children


def kill_cluster(cluster: str) -> None:
    """Every process of ``cluster`` killed at once, as when its machine dies: the
    postmaster is frozen first so that it cannot restart the children it loses."""
    postmaster, children = _cluster_pids(cluster)
    os.kill(postmaster, signal.SIGSTOP)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    os.kill(postmaster, signal.SIGKILL)


class _Pair(Fault):
    """A fault on a replicated pair; the scenario's database moves to the replica
    when it is promoted."""

    backends = ("postgres",)
    synchronous = False

    async def before_database(self, stage: Stage) -> None:
        self.primary, self.replica, self.replica_port = await replicated_pair(
            stage, self.synchronous
        )

    async def promote(self, stage: Stage) -> None:
        """Promote the replica (``pg_ctl promote`` waits until it accepts writes); the
        resume is counted from then, and the end of the scenario reads it."""
        await asyncio.to_thread(run_command, "pg_ctlcluster", VERSION, self.replica, "promote")
        stage.server_url = url_with(stage.server_url, port=self.replica_port)
        stage.url = url_with(stage.url, port=self.replica_port)
        (in_recovery,) = await admin(stage.url, "SELECT pg_is_in_recovery()")
        assert in_recovery is False, "the replica is still in recovery after promote"
        stage.resume_from_ns = time.monotonic_ns()


class Failover(_Pair):
    """The primary's machine dies mid-step; the replica is promoted; the drivers'
    address (the proxy) moves to it."""

    passes = 8

    def __init__(self, lag_s: float = 0.0, synchronous: bool = False) -> None:
        self.lag_s, self.synchronous = lag_s, synchronous
        mode = "synchronous" if synchronous else "asynchronous"
        lag = f", WAL sender stopped {lag_s:.1f} s" if lag_s else ""
        self.name = f"failover ({mode}{lag})"

    async def before_drivers(self, stage: Stage) -> None:
        self.proxy = ThreadedProxy("127.0.0.1", url_port(stage.server_url))
        stage.stack.callback(self.proxy.close)
        through = url_with(stage.url, host="127.0.0.1", port=self.proxy.port)
        stage.driver_urls = dict.fromkeys(range(8), through)

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        if self.lag_s:
            (sender,) = await admin(stage.server_url, "SELECT pid FROM pg_stat_replication")
            os.kill(int(sender), signal.SIGSTOP)
            # sleep: the fault's size: the replica falls this far behind
            await asyncio.sleep(self.lag_s)
        killed_ns = time.monotonic_ns()
        await asyncio.to_thread(kill_cluster, self.primary)
        await self.promote(stage)
        # The address moves: connections still open to the dead primary are reset.
        self.proxy.proxy.target = ("127.0.0.1", self.replica_port)
        self.proxy.cut()
        assert stage.resume_from_ns is not None
        stage.notes.append(
            f"promoted {(stage.resume_from_ns - killed_ns) / 1e9:.2f} s after the kill; "
            "resume counted from the promotion"
        )


class SplitBrain(_Pair):
    """The replica promoted while the old primary still accepts writes; a driver on
    the promoted server must take over no lease that is live on the old one early.

    After the scenario, ``leases`` holds each run's lease on the promoted server
    right after the promotion (its copies of the old primary's renewals stop
    there): the expiry (monotonic ns) and the holder's pid; ``deaths`` when each
    driver process exited (a proof of death by pid) and ``promoted_driver_pid``
    the process id of the promoted server's driver."""

    name = "failover, split brain (old primary not fenced)"
    passes = 12
    # Long enough that the old primary's drivers finish their runs before the
    # promoted server's copies of their leases expire: an overlap is then an early
    # takeover, not the split brain's own doing.
    lease_ms = 15_000
    deadline_s = 90.0

    async def before_drivers(self, stage: Stage) -> None:
        # The third driver works on the replica: nothing but errors until the promotion.
        stage.driver_urls = {2: url_with(stage.url, port=self.replica_port)}

    async def inject(self, stage: Stage) -> None:
        # Both runs held on the old primary, and their leases on the replica: a claim
        # the replica has not received is the split brain's own doing, not an early
        # takeover.
        for holder in stage.children[:2]:
            await stage.victim_body(only=holder)
        await _replayed(self.replica_url(stage), stage.url)
        await self.promote(stage)
        promoted_ns = stage.resume_from_ns
        assert promoted_ns is not None
        # Every body on the old primary counts too: the referee's resume says nothing here.
        stage.resume_from_ns = None
        on_promoted = stage.children[2]
        self.promoted_driver_pid, self.deaths = on_promoted.process.pid, stage.deaths
        self.leases = await _leases_ns(stage.url, other_than=on_promoted.name)
        first = await asyncio.to_thread(on_promoted.wait_for, "body", self.lease_ms / 1000 + 60)
        stage.notes.append(
            f"old primary left running; the promoted server's driver began its first body "
            f"{(first['ns'] - promoted_ns) / 1e9:.2f} s after the promotion (its copies of "
            f"the leases expired {(min(self.leases.values())[0] - promoted_ns) / 1e9:.2f} s "
            "after it)"
        )

    def replica_url(self, stage: Stage) -> str:
        return url_with(stage.url, port=self.replica_port)


async def _replayed(replica_url: str, primary_url: str) -> None:
    """Until the replica has replayed everything the primary has written so far."""
    (written,) = await admin(primary_url, "SELECT pg_current_wal_lsn()::text")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (done,) = await admin(replica_url, f"SELECT pg_last_wal_replay_lsn() >= '{written}'")
        if done:
            return
        # sleep: a poll for the replica's replay
        await asyncio.sleep(0.05)
    raise AssertionError("the replica did not catch up within 60 s")


async def _leases_ns(url: str, other_than: str) -> dict[str, tuple[int, int | None]]:
    """Each run leased at ``url`` by a driver not named ``other_than``: its expiry there
    on the monotonic clock (one host: the database's clock is this process's wall
    clock) and its holder's pid."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    select(
                        job_runs.c.id, job_runs.c.next_attempt_at, job_runs.c.lease_driver
                    ).where(job_runs.c.lease_owner.is_not(None))
                )
            ).all()
    finally:
        await engine.dispose()
    offset_ns = time.monotonic_ns() - time.time_ns()
    leases = {}
    for run_id, expiry, driver in rows:
        holder = parse_holder(driver)
        if not driver.startswith(f"{other_than} ") and holder is not None:
            expiry_ns = int(datetime.fromisoformat(expiry).timestamp() * 1e9) + offset_ns
            leases[run_id] = (expiry_ns, holder.pid)
    return leases
