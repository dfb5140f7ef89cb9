"""One database as the worker serves it: its drivers' idle waits and wake-ups.

Split from :mod:`jobrun.worker` (which drives them); see there and
:mod:`jobrun.worker.wakeups` for what wakes an idle database.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core import Clock, HeldLease, PassStart, PassWatch
from jobrun.sql.postgres.tenancy import notify_channel
from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.wakeups import sqlite_path

FIRST_IDLE_DELAY_S = 0.05


def database_label(engine: AsyncEngine) -> str:
    """The engine's URL with its password hidden: how logs and metrics name a database."""
    return engine.url.render_as_string(hide_password=True)


class ServedDatabase:
    """One database's drivers: who is idle, who polls, and how long the poller waits."""

    def __init__(self, store: SqlJobRunStore, clock: Clock, *, owned: bool = False) -> None:
        self.store = store
        self.engine = store.engine
        self.clock = clock
        # Made here from a URL: disposed of when it is no longer served.
        self.owned = owned
        # Set when the worker stops or the database is dropped from its set (``stop``
        # also when this worker's turn at serving it ends: see ``database_leases``).
        self.stop = asyncio.Event()
        self.gone = asyncio.Event()
        self.path = sqlite_path(store.engine)
        # Woken by writes (SQLite, inotify) or NOTIFY (Postgres, once listening): an
        # idle database is probed for its next due instant instead of polled.
        self.watched = False
        self.listening = False
        # SQLite: writes seen by inotify (or all, after lost events), and the held
        # leases last read with the count before that read: while no write comes, a
        # look for dead holders re-judges them (pid checks) without reading the file.
        self.writes_seen = 0
        self.leases_read: tuple[int, list[HeldLease]] | None = None
        # Postgres: until its first LISTEN stands (or fails), the drivers wait for it
        # rather than claim: a start-up costs one session per database, not two.
        self.awaiting_listen = False
        # Its once-in-a-while reads happen at its drives (see ``_Worker._database_tasks``).
        self.lazy = False
        self.unregistered_checked_at: float | None = None
        self.schedules_forgotten = False
        label = database_label(store.engine)
        self.label = label if store.schema is None else f"{label} schema {store.schema}"
        # One tenant's starts wake only that tenant's drivers.
        self.channel = notify_channel(store.schema)
        self.delay_s = FIRST_IDLE_DELAY_S
        self.polling = False
        # A wake-up that found nobody idle: the next driver to go idle claims again.
        self.pending = False
        # Monotonic instants: when the drives began to fail, and the last warning.
        self.failing_since: float | None = None
        self.warned_at = 0.0
        self._idle: deque[asyncio.Future[None]] = deque()

    def wake_one(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        if not self._idle:
            self.pending = True
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def idle(self, timeout_s: float | None) -> bool:
        """Wait to be woken (``True``), or ``timeout_s`` (``False``; ``None``: only when woken).

        A stopped database never waits: the stopper's one ``wake_all`` may have gone to
        other drivers already (it leaves nothing pending when someone was idle), so a
        driver that reaches here after the stop, from a read it was awaiting, would
        otherwise wait for a wake-up that never comes."""
        if self.stop.is_set():
            return True
        if self.pending:
            self.pending = False
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            async with self.clock.timeout(timeout_s):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._idle.remove(waiter)

    @property
    def woken(self) -> bool:
        return self.watched or self.listening


class WakeSiblings:
    """An observer that wakes one idle driver of the database whenever a pass starts."""

    def __init__(self, database: ServedDatabase) -> None:
        self._database = database

    def pass_started(self, start: PassStart) -> PassWatch | None:
        self._database.wake_one()
        return None
