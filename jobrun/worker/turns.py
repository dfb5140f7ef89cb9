"""The worker's set of databases: read again (SIGHUP), and split between workers.

A part of ``jobrun.worker.serving._Worker``, kept apart so that each module
stays short: each new set put on the worker's ``reloads`` queue is served (new
databases start, dropped ones stop after their passes), and with
``max_databases`` each database is served only in turns, while this worker holds
its serving lease (see :mod:`jobrun.worker.database_leases`). It also knows the
SQLite databases by file, for the writes that wake them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.database import ServedDatabase
from jobrun.worker.database_leases import CHECK_S as SERVING_CHECK_S
from jobrun.worker.database_leases import RETRY_S as SERVING_RETRY_S
from jobrun.worker.database_leases import PostgresServingLease, ServingLease, serving_lease
from jobrun.worker.rounds import sleep
from jobrun.worker.settings import WorkerSettings

log = logging.getLogger("jobrun.worker")

Database = str | AsyncEngine | SqlJobRunStore
Serve = Callable[[ServedDatabase], Coroutine[Any, Any, None]]
DatabaseTasks = Callable[[ServedDatabase, asyncio.TaskGroup], None]


class ServedSet:
    """What the worker does with its set of databases (see the module's docstring).

    ``serve`` runs every task of one database until it is dropped or the worker
    stops; ``database_tasks`` starts those tasks in a group (both the worker's)."""

    def __init__(
        self,
        settings: WorkerSettings,
        wakeups: collections.Counter[str],
        serve: Serve,
        database_tasks: DatabaseTasks,
    ) -> None:
        self.settings = settings
        self.wakeups = wakeups
        self._serve = serve
        self._database_tasks = database_tasks
        self.databases: list[ServedDatabase] = []
        # Set by the worker once it can make them (it owns the engines made from URLs).
        self.make_database: Callable[[Database], ServedDatabase] = cannot_make
        # The worker's task group, once it runs: a database added by a reload joins it.
        self.group: asyncio.TaskGroup | None = None
        self.by_path: dict[Path, ServedDatabase] = {}
        self._serving: set[ServedDatabase] = set()

    async def serve_in_turns(self, database: ServedDatabase) -> None:
        """With ``max_databases``: serve the database while this worker holds its
        serving lease (see ``jobrun.worker.database_leases``); try again every ``RETRY_S``."""
        lease = serving_lease(database.store, database.path)
        while not database.gone.is_set():
            if await self._take_room(database, lease):
                log.info("serving %s (took its serving lease)", database.label)
                try:
                    async with asyncio.TaskGroup() as group:
                        self._database_tasks(database, group)
                        if isinstance(lease, PostgresServingLease):
                            group.create_task(self._keep_serving(database, lease))
                finally:
                    self._serving.discard(database)
                    await lease.release()
                if database.gone.is_set():
                    return
                log.info("stopped serving %s (its serving lease is another's)", database.label)
                database.stop = asyncio.Event()
            elif database.owned and not database.watched:
                # Not ours: no session kept open for it meanwhile (Postgres: the presence).
                await database.engine.dispose()
            retry_s = SERVING_RETRY_S * (0.5 + random.random())
            await sleep(self.settings.clock, retry_s, database.gone)

    async def _take_room(self, database: ServedDatabase, lease: ServingLease) -> bool:
        """Room under the cap (kept while the lease is tried: others wait their turn),
        and the database's serving lease."""
        if len(self._serving) >= (self.settings.max_databases or 0):
            return False
        self._serving.add(database)
        if await _took(lease, database):
            return True
        self._serving.discard(database)
        return False

    async def _keep_serving(self, database: ServedDatabase, lease: PostgresServingLease) -> None:
        """A presence session lost and opened again holds no lock: take it again, or
        stop serving (passes in flight finish) when another worker has it now."""
        while not database.stop.is_set():
            await sleep(self.settings.clock, SERVING_CHECK_S, database.stop)
            if database.stop.is_set() or await _took(lease, database):
                continue
            database.stop.set()
            database.wake_all()

    async def reload(self, reloads: asyncio.Queue[Sequence[Database]]) -> None:
        """Serve each new set of databases: the new ones start, the dropped ones stop
        (their passes in flight finish first)."""
        while not self.settings.stop.is_set():
            getting = asyncio.ensure_future(reloads.get())
            stopping = asyncio.ensure_future(self.settings.stop.wait())
            await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not getting.done():
                getting.cancel()
                return
            try:
                self._replace(getting.result())
            except Exception as error:
                log.error("cannot serve the new set of databases: %s; kept the old one", error)

    def _replace(self, wanted: Sequence[Database]) -> None:
        served = {database.label: database for database in self.databases}
        chosen: dict[str, ServedDatabase] = {}
        for item in wanted:
            schema = self.settings.schema
            label = _label_of_url(item, schema) if isinstance(item, str) else None
            found = served.get(label) if label is not None else None
            made = found if found is not None else self.make_database(item)
            chosen.setdefault(made.label, served.get(made.label, made))
        for label, database in served.items():
            if label not in chosen:
                log.info("no longer serving %s", label, extra={"database": label})
                database.gone.set()
                database.stop.set()
                database.wake_all()
        kept = [served[label] for label in chosen if label in served]
        added = [database for label, database in chosen.items() if label not in served]
        self.databases = kept + added
        assert self.group is not None
        for database in added:
            log.info("now serving %s", database.label, extra={"database": database.label})
            self.group.create_task(self._serve(database))
        log.info("serving %d databases (%d added)", len(self.databases), len(added))

    def written(self, path: Path) -> None:
        database = self.by_path.get(path)
        if database is not None:
            database.writes_seen += 1
            self.wakeups["write"] += 1
            log.debug("woken by a write to %s", database.label, extra={"database": database.label})
            database.wake_all()

    def wake_every_file(self) -> None:
        self.wakeups["sweep"] += 1
        for database in list(self.by_path.values()):
            database.writes_seen += 1  # any of them may have been written
            database.wake_all()


async def _took(lease: ServingLease, database: ServedDatabase) -> bool:
    try:
        return await lease.try_take()
    except Exception as error:
        log.debug("taking the serving lease of %s failed: %s", database.label, error)
        return False


def cannot_make(database: Any) -> ServedDatabase:
    raise RuntimeError("this worker makes no databases")


def _label_of_url(url: str, schema: str | None) -> str:
    label = make_url(url).render_as_string(hide_password=True)
    return label if schema is None else f"{label} schema {schema}"
