"""What a Postgres server spent on a benchmark: backend CPU, the machine's CPU, WAL bytes.

* CPU of a process: ``utime + stime`` of ``/proc/<pid>/stat`` (all its threads), in
  seconds. A Postgres backend's pid comes from ``pg_stat_activity``; when the server
  runs on another host (or in a container whose pids this one cannot see) the
  figure is ``None``, never a guess.
* The machine: the first line of ``/proc/stat`` (busy and idle time of all CPUs).
* WAL: ``pg_current_wal_lsn()`` before and after, as a byte difference
  (``pg_wal_lsn_diff``), which counts every database's writes on a shared server;
  and, where ``pg_waldump`` and the server's ``pg_wal`` directory are readable from
  here, the bytes of the records of one database alone: records that touch its
  relations, and every record (commits included) of a transaction that did. A
  temporary physical replication slot keeps those WAL files from being recycled
  until they are read (a shared server's ``DROP DATABASE`` forces checkpoints).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# One pg_waldump line: "rmgr: Heap len (rec/tot): 79/ 79, tx: 1234, lsn: ..., desc: ...,
# blkref #0: rel 1663/16384/16390 blk 0".
_WAL_TOTAL = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+)")
_WAL_DATABASE = re.compile(r"rel \d+/(\d+)/\d+")


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far (None if not visible)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: count fields after its ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def processes_cpu_s(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each visible process in ``pids``."""
    found = {pid: process_cpu_s(pid) for pid in pids}
    return {pid: spent for pid, spent in found.items() if spent is not None}


def spent_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings; a process new in ``after`` counts whole
    (it started inside the window), one gone from ``after`` is left out."""
    return sum(spent - before.get(pid, 0.0) for pid, spent in after.items())


@dataclass(frozen=True)
class MachineCpu:
    """The machine's CPU time so far, summed over all CPUs, in seconds."""

    busy_s: float
    idle_s: float

    @staticmethod
    def read() -> MachineCpu:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        idle = fields[3] + fields[4]
        busy = sum(fields[:8]) - idle
        return MachineCpu(busy / TICKS_PER_S, idle / TICKS_PER_S)

    def minus(self, earlier: MachineCpu) -> MachineCpu:
        return MachineCpu(self.busy_s - earlier.busy_s, self.idle_s - earlier.idle_s)

    @property
    def busy_share(self) -> float:
        total = self.busy_s + self.idle_s
        return self.busy_s / total if total else 0.0


async def backend_pids(connection: Any, application: str, database: str) -> list[int]:
    """The client backends serving a benchmark in ``database``: its connections (named
    ``application``) and the jobrun presence sessions its drivers hold there."""
    rows = await connection.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() "
        "AND (application_name = $2 OR application_name LIKE 'jobrun presence %')",
        database,
        application,
    )
    return [row["pid"] for row in rows]


async def background_pids(connection: Any) -> list[int]:
    """The server's own processes (WAL writer, checkpointer, autovacuum, ...): they
    work for every database on the server, this benchmark's among them."""
    rows = await connection.fetch(
        "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'"
    )
    return [row["pid"] for row in rows]


async def wal_lsn(connection: Any) -> str:
    return str(await connection.fetchval("SELECT pg_current_wal_lsn()::text"))


async def wal_bytes(connection: Any, start_lsn: str, end_lsn: str) -> int:
    return int(
        await connection.fetchval(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", end_lsn, start_lsn
        )
    )


async def other_commits(connection: Any, database: str) -> int:
    """Transactions committed so far in every other database (a shared server's noise)."""
    found = await connection.fetchval(
        "SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database "
        "WHERE datname IS NOT NULL AND datname <> $1",
        database,
    )
    return int(found)


class WalReader:
    """Reads the WAL of one database on a server whose ``pg_wal`` is local (else off)."""

    def __init__(self, waldump: str | None, wal_directory: Path | None, database_oid: int) -> None:
        self.waldump = waldump
        self.wal_directory = wal_directory
        self.database_oid = database_oid
        self.slot: str | None = None
        self.last_error: str | None = None

    @staticmethod
    async def open(connection: Any, database: str) -> WalReader:
        oid = int(
            await connection.fetchval("SELECT oid FROM pg_database WHERE datname = $1", database)
        )
        try:
            data = Path(str(await connection.fetchval("SHOW data_directory")))
        except Exception:  # not a superuser nor pg_read_all_settings: no attribution
            return WalReader(None, None, oid)
        major = int(await connection.fetchval("SHOW server_version_num")) // 10000
        waldump = shutil.which("pg_waldump") or _packaged_waldump(major)
        wal = data / "pg_wal"
        usable = waldump is not None and os.access(wal, os.R_OK | os.X_OK)
        reader = WalReader(waldump if usable else None, wal if usable else None, oid)
        if usable:
            await reader._keep_wal(connection)
        return reader

    async def _keep_wal(self, connection: Any) -> None:
        """A temporary slot (gone with ``connection``) that keeps the WAL until read."""
        name = f"jobrun_bench_wal_{os.getpid()}"
        try:
            await connection.execute(
                "SELECT pg_create_physical_replication_slot($1, true, true)", name
            )
        except Exception as error:  # no replication privilege or no free slot: best effort
            self.last_error = f"no slot: {error}"
            return
        self.slot = name

    @property
    def usable(self) -> bool:
        return self.waldump is not None

    async def database_bytes(self, connection: Any, start_lsn: str, end_lsn: str) -> int | None:
        """WAL bytes between the two positions that belong to this database's work;
        the WAL before ``end_lsn`` is then let go."""
        if self.waldump is None or self.wal_directory is None:
            return None
        command = [self.waldump, "-p", str(self.wal_directory), "-s", start_lsn, "-e", end_lsn]
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, check=False
        )
        if self.slot is not None:
            await connection.execute(
                "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)", self.slot, end_lsn
            )
        if not done.stdout:
            self.last_error = done.stderr.strip()[:300]
            return None
        return self._attributed(done.stdout.splitlines())

    def _attributed(self, lines: list[str]) -> int:
        mine = str(self.database_oid)
        records: list[tuple[int, int, bool]] = []
        transactions: set[int] = set()
        for line in lines:
            sizes = _WAL_TOTAL.search(line)
            if sizes is None:
                continue
            total, transaction = int(sizes[1]), int(sizes[2])
            touches = any(found == mine for found in _WAL_DATABASE.findall(line))
            records.append((total, transaction, touches))
            if touches and transaction:
                transactions.add(transaction)
        return sum(
            total
            for total, transaction, touches in records
            if touches or (transaction and transaction in transactions)
        )


def _packaged_waldump(major: int) -> str | None:
    candidate = Path(f"/usr/lib/postgresql/{major}/bin/pg_waldump")
    return str(candidate) if candidate.exists() else None
