"""Faults that need a machine of their own: a throwaway Postgres cluster, a small tmpfs.

The cluster (``pg_createcluster 15 <name>``) has its data directory on a tmpfs
mounted for the scenario, listens on a free port of localhost (its default), trusts
local logins, and is dropped (``pg_dropcluster --stop``) and unmounted at the
end. The shared server at 5432 is never touched by these faults. Disk full
means filling the tmpfs with a file, holding it full, and deleting the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.chaos.stage import Fault, Stage, admin

VERSION = "15"
FILLER = "filler"


def run_command(*command: str, timeout_s: float = 120) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.returncode} {done.stderr.strip()[-500:]}")
    return done.stdout


async def mount_tmpfs(stage: Stage, size_mb: int) -> Path:
    """A tmpfs of ``size_mb`` on a fresh directory, unmounted and removed at the end."""
    directory = Path(tempfile.mkdtemp(prefix="jobrun-chaos-"))
    try:
        await asyncio.to_thread(
            run_command, "mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(directory)
        )
    except BaseException:
        os.rmdir(directory)
        raise

    def unmount() -> None:
        run_command("umount", str(directory))
        directory.rmdir()

    stage.stack.callback(unmount)
    return directory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _drop_cluster(name: str) -> None:
    if name in run_command("pg_lsclusters", "-h", VERSION):
        run_command("pg_dropcluster", "--stop", VERSION, name)


async def new_cluster(stage: Stage, role: str, *, start: bool = True) -> tuple[str, int]:
    """A cluster of a unique name on a fresh tmpfs and a free port (dropped at the end,
    even on failure): its name and port; started unless ``start`` is false."""
    mount = await mount_tmpfs(stage, 160)
    shutil.chown(mount, "postgres", "postgres")
    name, port = f"chaos_{role}_{uuid.uuid4().hex[:6]}", free_port()
    stage.stack.callback(_drop_cluster, name)
    settings = ["max_wal_size=48MB", "min_wal_size=4MB"]
    settings += ["shared_buffers=16MB", "fsync=off", "restart_after_crash=on"]
    create = ["pg_createcluster", "-q", "-p", str(port), "-d", str(mount / "data")]
    create += [option for setting in settings for option in ("-o", setting)]
    create += [VERSION, name, "--", "--auth=trust", "--wal-segsize=1"]
    await asyncio.to_thread(run_command, *create)
    if start:
        await asyncio.to_thread(run_command, "pg_ctlcluster", VERSION, name, "start")
    return name, port


async def throwaway_cluster(stage: Stage) -> tuple[str, Path]:
    """Create and start a cluster on a tmpfs: its name and mount. Points ``server_url`` at it."""
    name, port = await new_cluster(stage, "server")
    stage.server_url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    stage.notes.append(f"throwaway cluster {name} on a 160 MB tmpfs")
    return name, data_directory(name).parent


def data_directory(cluster: str) -> Path:
    """Where ``cluster`` keeps its data."""
    found = run_command("pg_conftool", "-s", VERSION, cluster, "show", "data_directory")
    return Path(found.strip())


def fill(directory: Path, limit_mb: int) -> int:
    """Write zeros into ``directory`` until the disk is full; MB written (bounded)."""
    chunk, written = bytes(1 << 20), 0
    # Unbuffered: a full disk shows on the write, not on a later flush or close.
    with (directory / FILLER).open("wb", buffering=0) as filler, contextlib.suppress(OSError):
        for _ in range(limit_mb):
            filler.write(chunk)
            written += 1
    return written


class PostgresRestart(Fault):
    """Postgres restarted (fast, immediate) or down for ``outage_s`` while drivers work."""

    backends = ("postgres",)
    passes = 6

    def __init__(self, mode: str, outage_s: float = 0) -> None:
        self.mode, self.outage_s = mode, outage_s
        self.name = f"Postgres outage {outage_s:.0f} s" if outage_s else f"Postgres restart {mode}"
        self.deadline_s = 60 + outage_s

    async def before_database(self, stage: Stage) -> None:
        self.cluster, _mount = await throwaway_cluster(stage)

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        if self.outage_s:
            await asyncio.to_thread(
                run_command, "pg_ctlcluster", VERSION, self.cluster, "stop", "-m", "fast"
            )
            # sleep: the outage's length
            await asyncio.sleep(self.outage_s)
            await until_back(stage, "pg_ctlcluster", VERSION, self.cluster, "start")
        else:
            command = ("pg_ctlcluster", VERSION, self.cluster, "restart", "-m", self.mode)
            await until_back(stage, *command)


class DiskFull(Fault):
    """The cluster's disk full for ``full_s``, then freed."""

    name, backends = "Postgres disk full 5 s", ("postgres",)
    passes, full_s = 12, 5.0  # filling takes a while: the runs must outlast it

    async def before_database(self, stage: Stage) -> None:
        self.cluster, self.mount = await throwaway_cluster(stage)

    async def before_drivers(self, stage: Stage) -> None:
        # One row now: the page it allocates takes the later one-row inserts.
        await admin(
            stage.url,
            "CREATE TABLE chaos_pressure (n int)",
            "INSERT INTO chaos_pressure VALUES (0)",
        )

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        written = await asyncio.to_thread(fill, self.mount, 1024)
        try:
            stage.notes.append(await _press(stage.url))
            # sleep: how long the disk stays full
            await asyncio.sleep(self.full_s)
        finally:
            (self.mount / FILLER).unlink()
        stage.notes.append(f"filled {written} MB")
        await _bring_back(stage, self.cluster)


async def _press(url: str) -> str:
    """Make Postgres need new space (new WAL segments) until it fails.

    The drivers' own writes are too small: they fit in recycled WAL segments and
    pages already allocated, so a full disk alone would not reach them.
    """
    for _ in range(40):
        try:
            await admin(url, "INSERT INTO chaos_pressure VALUES (1)", "SELECT pg_switch_wal()")
        except Exception as error:
            return f"Postgres refused new space: {' '.join(str(error).split())[:160]}"
    return "Postgres never ran out of space"


async def _accepts(url: str) -> bool:
    try:
        await admin(url, "SELECT 1")
    except Exception:
        return False
    return True


async def until_back(stage: Stage, *command: str) -> None:
    """Run a start or restart; the fault ends when the server accepts connections again.

    Not when the command returns: ``pg_ctlcluster`` waits a while after the
    server is ready, and the drivers do not.
    """
    running = asyncio.ensure_future(asyncio.to_thread(run_command, *command))
    seen_down, deadline = False, time.monotonic() + 120
    while time.monotonic() < deadline:
        up = await _accepts(stage.server_url)
        if up and (seen_down or running.done()):
            stage.resume_from_ns = time.monotonic_ns()
            break
        seen_down = seen_down or not up
        # sleep: a poll for the server coming back
        await asyncio.sleep(0.05)
    await running


async def _bring_back(stage: Stage, cluster: str) -> None:
    """After the disk is freed: is Postgres up within 10 s? Start it by hand if not (noted)."""
    for _ in range(50):
        if await _accepts(stage.server_url):
            stage.resume_from_ns = time.monotonic_ns()
            return
        # sleep: a poll for the server's own restart after a crash
        await asyncio.sleep(0.2)
    stage.notes.append("Postgres still down 10 s after the disk was freed: started by hand")
    await until_back(stage, "pg_ctlcluster", VERSION, cluster, "start")


class SqliteDiskFull(Fault):
    """The SQLite file's disk (an 8 MB tmpfs) full for ``full_s``, then freed."""

    name, backends = "SQLite disk full 5 s", ("sqlite",)
    passes, full_s = 6, 5.0

    async def before_database(self, stage: Stage) -> None:
        stage.sqlite_dir = await mount_tmpfs(stage, 8)

    async def inject(self, stage: Stage) -> None:
        await stage.victim_body()
        assert stage.sqlite_dir is not None
        written = await asyncio.to_thread(fill, stage.sqlite_dir, 64)
        try:
            # sleep: how long the disk stays full
            await asyncio.sleep(self.full_s)
        finally:
            (stage.sqlite_dir / FILLER).unlink()
        stage.notes.append(f"filled {written} MB")
        stage.resume_from_ns = time.monotonic_ns()
