"""Two ``jobrun worker`` processes with library defaults over one database; the one
holding the only run is killed with kill -9 while the other is idle (issue 31 item 1).

Not a test module: ``test_idle_survivor.py`` asserts on it. The workers run
``survivor_app.py``, whose step bodies append ``<pid> <time> <run>`` to a log file,
so the survivor's first body is read from that file, not from what the worker says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.support import JOBRUN, REPO

APP = "tests.processes.survivor_app:registry"
MODULE, JOB = "survivor", "walk"
# A look for a takeover that must not happen while the holder lives.
LIVE_LOOK_S = 1.5
# Bounds a hang only: the default lease (60 s) and then some.
BODY_DEADLINE_S = 100.0


@dataclass(frozen=True)
class Takeover:
    """One kill and what the survivor did about it (``time.time()`` instants)."""

    killed_at: float
    first_body_at: float
    # The dead holder's lease expiry, read just before the kill.
    lease_expires_at: float

    @property
    def latency_s(self) -> float:
        """Seconds from the kill to the survivor's first body."""
        return self.first_body_at - self.killed_at

    @property
    def lease_left_s(self) -> float:
        """Seconds of the dead holder's lease left when the survivor's body began."""
        return self.lease_expires_at - self.first_body_at


class WorkerProcess:
    """A ``jobrun worker`` (under ``prefix``, e.g. ``unshare``), its stderr read in a thread."""

    def __init__(
        self, where: Sequence[str], log: Path, *, hang: bool, foreign: bool, prefix: Sequence[str]
    ) -> None:
        environment = dict(os.environ, PYTHONPATH=str(REPO), JOBRUN_SURVIVOR_LOG=str(log))
        environment |= {"JOBRUN_SURVIVOR_HANG": "1" if hang else "0"}
        environment |= {"JOBRUN_SURVIVOR_FOREIGN": "1" if foreign else "0"}
        self.process = subprocess.Popen(
            [*prefix, str(JOBRUN), "worker", "--app", APP, *where],
            cwd=REPO,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if "worker started" in line:
                self.started.set()

    def wait_started(self, timeout_s: float = 60.0) -> None:
        if not self.started.wait(timeout_s):
            raise AssertionError(f"the worker did not start: {''.join(self.lines[-20:])}")

    def end(self) -> None:
        if self.process.poll() is None:
            # (Under ``unshare --kill-child`` the worker, its child, dies with it.)
            self.process.kill()
        self.process.wait(timeout=30)
        # The reader ends at the pipe's end of file (every writer gone).
        self._reader.join(timeout=30)
        assert self.process.stderr is not None
        self.process.stderr.close()


def bodies(log: Path) -> list[tuple[int, float, str]]:
    """``(pid, time, run id)`` of each body started so far."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        pid, at, run_id = line.split()
        found.append((int(pid), float(at), run_id))
    return found


def wait_for_body(log: Path, seen: int, timeout_s: float) -> tuple[int, float, str]:
    """The first body logged after the first ``seen`` ones."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = bodies(log)
        if len(found) > seen:
            return found[seen]
        # sleep: a poll interval of a file; the deadline only bounds a hang
        time.sleep(0.01)
    raise AssertionError(f"no body after the first {seen} within {timeout_s} s")


async def _start_run(url: str) -> str:
    engine = create_async_engine(url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        return (await jobrun.start_job_run(store, module_id=MODULE, job=JOB)).id
    finally:
        await engine.dispose()


async def _lease_expiry(url: str, run_id: str) -> float:
    engine = create_async_engine(url)
    try:
        run = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), run_id)
    finally:
        await engine.dispose()
    assert run is not None
    assert run.lease_driver is not None, "the holder holds no lease"
    assert run.lease_expires_at is not None
    return run.lease_expires_at.timestamp()


@contextlib.contextmanager
def _workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        for worker in started:
            worker.end()


async def idle_survivor_takeover(
    url: str,
    workdir: Path,
    *,
    foreign: bool = False,
    survivor_prefix: Sequence[str] = (),
    where: Sequence[str] = (),
) -> Takeover:
    """Start one run in ``url`` and a holder worker; once it is in the run's body,
    start the survivor worker (``foreign``: as if on another host; under
    ``survivor_prefix``), let it idle, kill -9 the holder, and time the survivor's
    first body. Both workers serve ``where`` (options; ``--url URL`` by default)."""
    log = workdir / "survivor-bodies.log"
    where = where or ("--url", url)
    run_id = await _start_run(url)
    with _workers() as started:
        holder = WorkerProcess(where, log, hang=True, foreign=False, prefix=())
        started.append(holder)
        await asyncio.to_thread(wait_for_body, log, 0, 60.0)
        survivor = WorkerProcess(where, log, hang=False, foreign=foreign, prefix=survivor_prefix)
        started.append(survivor)
        await asyncio.to_thread(survivor.wait_started)
        # sleep: a look for a takeover that must not happen while the holder lives
        # (load can only make it pass more easily); the survivor is idle by then.
        await asyncio.sleep(LIVE_LOOK_S)
        assert len(bodies(log)) == 1, "the survivor took a live holder's run"
        expires_at = await _lease_expiry(url, run_id)
        killed_at = time.time()
        holder.process.send_signal(signal.SIGKILL)
        holder.process.wait(timeout=30)
        _pid, first_at, taken = await asyncio.to_thread(wait_for_body, log, 1, BODY_DEADLINE_S)
        assert taken == run_id
    return Takeover(killed_at, first_at, expires_at)
