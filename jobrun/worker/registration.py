"""The worker's row in each database it serves: who it is, which jobs it runs, that it lives.

A task per served database (started with the database's other tasks, so a
worker serving in turns registers only while it serves): one write at once, one
every heartbeat after. A worker serving more databases than ``MAX_BEATS_PER_S``
heartbeats' worth stretches each database's heartbeat
(``jobrun._core.operator.worker_registry.heartbeat_for``; the row's expiry says
so) and makes its first write there at a random point of the first heartbeat: a
thousand idle databases cost two writes a second, not a hundred, and no burst
at start-up (every ``SWEEP_EVERY_BEATS``-th also deletes the rows
of workers gone), and the row deleted when the worker stops serving the
database. A failed write is logged and tried again at the next heartbeat: the
worker's real work never waits on its row. In a SQLite file the row is written
through a stdlib connection in a thread, never through an engine opened for it
(see :mod:`jobrun.sql.next_due`). See
:mod:`jobrun._core.operator.worker_registry` for what readers make of the rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from jobrun._core import (
    DEFAULT_HEARTBEAT_S,
    Clock,
    JobRegistry,
    WorkerRow,
    beat_row,
    format_instant,
    heartbeat_for,
    jobs_text,
    sweep_due,
)
from jobrun._host import current_pid, host_name
from jobrun.errors import describe_exception
from jobrun.sql.next_due import sqlite_beat_worker, sqlite_forget_worker
from jobrun.worker.database import ServedDatabase

log = logging.getLogger("jobrun.worker")

FORGET_TIMEOUT_S = 5.0
"""How long a stopping worker waits for its row's deletion (else the row expires)."""

__all__ = ["DEFAULT_HEARTBEAT_S", "Registration"]

Opening = Callable[[ServedDatabase], AbstractAsyncContextManager[None]]


class Registration:
    """One worker process's registration: the same id in every database it serves."""

    def __init__(
        self,
        registry: JobRegistry,
        name: str,
        clock: Clock,
        heartbeat_s: float,
        served: Callable[[], int] = lambda: 1,
        chance: random.Random | None = None,
    ) -> None:
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        # How many databases the worker serves (the heartbeat stretches with it).
        self.served = served
        self.chance = chance or random.Random()
        jobs = jobs_text((job.module_id, job.name) for job in registry)
        started_at = format_instant(clock.now())
        self.row = WorkerRow(
            uuid.uuid4().hex, name, host_name(), current_pid(), jobs, started_at, "", ""
        )

    async def keep(self, database: ServedDatabase, opening: Opening) -> None:
        """Register in ``database`` until it stops being served, then deregister."""
        beats = 0
        failing = False
        try:
            heartbeat_s = self._heartbeat_s()
            if heartbeat_s > self.heartbeat_s:
                # Many databases: their first writes spread over the first heartbeat.
                await self._wait(database, self.chance.uniform(0.0, heartbeat_s))
            while not database.stop.is_set():
                heartbeat_s = self._heartbeat_s()
                failing = await self._beat(database, opening, beats, failing, heartbeat_s)
                beats += 1
                await self._wait(database, heartbeat_s)
        finally:
            await self._forget(database, opening)

    def _heartbeat_s(self) -> float:
        return heartbeat_for(self.heartbeat_s, self.served())

    async def _wait(self, database: ServedDatabase, seconds: float) -> None:
        """Wait ``seconds``, or less if the database stops being served."""
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(seconds):
                await database.stop.wait()

    async def _beat(
        self,
        database: ServedDatabase,
        opening: Opening,
        beats: int,
        failing: bool,
        heartbeat_s: float,
    ) -> bool:
        """One heartbeat; whether it failed (a streak of failures is warned of once)."""
        now = self.clock.now()
        row = beat_row(self.row, now, heartbeat_s)
        sweep_at = format_instant(now) if sweep_due(beats) else None
        try:
            if database.path is not None:
                # A SQLite file: written through a connection of its own, in a thread
                # (see ``jobrun.sql.next_due``), not through an engine opened for it.
                await asyncio.to_thread(sqlite_beat_worker, database.path, row, sweep_at)
            else:
                async with opening(database):
                    await database.store.beat_worker(row, sweep_at)
        except Exception as error:
            log.log(
                logging.DEBUG if failing else logging.WARNING,
                "registering this worker in %s failed: %s; trying again in %.1f s",
                database.label,
                describe_exception(error),
                heartbeat_s,
                extra={"database": database.label},
            )
            return True
        return False

    async def _forget(self, database: ServedDatabase, opening: Opening) -> None:
        try:
            async with asyncio.timeout(FORGET_TIMEOUT_S):
                if database.path is not None:
                    await asyncio.to_thread(sqlite_forget_worker, database.path, self.row.id)
                else:
                    async with opening(database):
                        await database.store.forget_worker(self.row.id)
        except Exception as error:
            # Left behind, the row expires by itself at its expiry.
            log.debug("deregistering from %s failed: %s", database.label, error)
