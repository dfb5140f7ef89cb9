"""The worker's LISTEN for new runs on Postgres (a part of ``jobrun.worker.serving._Worker``).

On the store's presence connection (see :mod:`jobrun.sql.postgres.presence`): a
``NOTIFY jobrun_started`` for a job this worker registers wakes the database's
drivers at once, and while the LISTEN stands the idle database is not polled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core import Clock, JobRegistry
from jobrun.worker.database import ServedDatabase
from jobrun.worker.rounds import repeat

log = logging.getLogger("jobrun.worker")


def listens(engine: AsyncEngine) -> bool:
    """Whether the worker LISTENs on ``engine``'s database (Postgres through asyncpg)."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"


class Listener:
    """LISTEN per Postgres database, reconnected when lost; counts its wake-ups."""

    def __init__(
        self,
        registry: JobRegistry,
        interval_s: float,
        clock: Clock,
        wakeups: collections.Counter[str],
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.clock = clock
        self.wakeups = wakeups

    def _wanted(self, payload: str) -> bool:
        try:
            module_id, job = json.loads(payload)
        except (ValueError, TypeError):
            return True
        return (module_id, job) in self.registry

    async def listen(self, database: ServedDatabase) -> None:
        """LISTEN for new runs on a connection of its own; reconnect when it is lost."""

        async def listen() -> float:
            await self._listen_once(database)
            return self.interval_s

        try:
            failed = listen_failed(database, self.interval_s)
            await repeat(self.clock, database, listen, failed)
        finally:
            database.listening = database.awaiting_listen = False

    async def _listen_once(self, database: ServedDatabase) -> None:
        """Listen until the worker stops (returns) or the connection is lost (returns too)."""
        lost = asyncio.Event()

        def notified(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
            if self._wanted(payload):
                self.wakeups["notify"] += 1
                log.debug("woken by NOTIFY on %s", database.label)
                database.wake_all()

        # The store's presence connection (see ``jobrun.sql.postgres.presence``): a connection
        # of its own, never one of the host's pool, which a small pool could not spare.
        raw = await database.store.presence_connection()
        assert raw is not None

        def on_lost(_connection: Any) -> None:
            lost.set()

        raw.add_termination_listener(on_lost)
        store = database.store
        await store.on_presence_connection(lambda raw: raw.add_listener(database.channel, notified))
        log.debug("listening for new runs on %s", database.label)
        # From now on a NOTIFY wakes it: idle, it is probed, not polled.
        database.listening = True
        database.awaiting_listen = False
        # Anything started before the LISTEN took effect: look now.
        database.wake_all()
        stopping = asyncio.ensure_future(database.stop.wait())
        losing = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({stopping, losing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            losing.cancel()
            raw.remove_termination_listener(on_lost)
        database.listening = False
        if lost.is_set():
            log.warning("lost the listening connection to %s", database.label)
            return
        with contextlib.suppress(Exception):
            await store.on_presence_connection(
                lambda raw: raw.remove_listener(database.channel, notified)
            )


def listen_failed(database: ServedDatabase, interval_s: float) -> Callable[[Exception], float]:
    def failed(error: Exception) -> float:
        # No LISTEN for now: the drivers poll meanwhile.
        database.awaiting_listen = False
        database.wake_all()
        log.warning(
            "listening on %s failed: %s; polling every %.1f s meanwhile",
            database.label,
            error,
            interval_s,
            extra={"database": database.label},
        )
        return interval_s

    return failed
