"""The worker's set of databases: read again (SIGHUP), and split between workers.

A mixin of ``jobrun.worker.serving._Worker``, kept apart so that each module stays short:
each new set put on the worker's ``reloads`` queue is served (new databases
start, dropped ones stop after their passes), and with ``max_databases`` each
database is served only in turns, while this worker holds its serving lease
(see :mod:`jobrun.worker.database_leases`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.database import ServedDatabase
from jobrun.worker.database_leases import CHECK_S as SERVING_CHECK_S
from jobrun.worker.database_leases import RETRY_S as SERVING_RETRY_S
from jobrun.worker.database_leases import PostgresServingLease, ServingLease, serving_lease

log = logging.getLogger("jobrun.worker")

Database = str | AsyncEngine | SqlJobRunStore


class DatabaseTurns:
    """What the worker does with its set of databases (see the module's docstring)."""

    databases: list[ServedDatabase]
    stop: asyncio.Event
    max_databases: int | None
    schema: str | None
    make_database: Callable[[Database], ServedDatabase]
    wakeups: collections.Counter[str]
    _serving: set[ServedDatabase]
    _group: asyncio.TaskGroup | None
    _by_path: dict[Path, ServedDatabase]

    def _database_tasks(self, database: ServedDatabase, group: asyncio.TaskGroup) -> None:
        raise NotImplementedError

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> None:
        raise NotImplementedError

    async def _serve(self, database: ServedDatabase) -> None:
        raise NotImplementedError

    async def _serve_in_turns(self, database: ServedDatabase) -> None:
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
            await self._sleep(SERVING_RETRY_S * (0.5 + random.random()), database.gone)

    async def _take_room(self, database: ServedDatabase, lease: ServingLease) -> bool:
        """Room under the cap (kept while the lease is tried: others wait their turn),
        and the database's serving lease."""
        if len(self._serving) >= (self.max_databases or 0):
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
            await self._sleep(SERVING_CHECK_S, database.stop)
            if database.stop.is_set() or await _took(lease, database):
                continue
            database.stop.set()
            database.wake_all()

    async def _reload(self, reloads: asyncio.Queue[Sequence[Database]]) -> None:
        """Serve each new set of databases: the new ones start, the dropped ones stop
        (their passes in flight finish first)."""
        while not self.stop.is_set():
            getting = asyncio.ensure_future(reloads.get())
            stopping = asyncio.ensure_future(self.stop.wait())
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
            label = _label_of_url(item, self.schema) if isinstance(item, str) else None
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
        assert self._group is not None
        for database in added:
            log.info("now serving %s", database.label, extra={"database": database.label})
            self._group.create_task(self._serve(database))
        log.info("serving %d databases (%d added)", len(self.databases), len(added))

    def _written(self, path: Path) -> None:
        database = self._by_path.get(path)
        if database is not None:
            database.writes_seen += 1
            self.wakeups["write"] += 1
            log.debug("woken by a write to %s", database.label, extra={"database": database.label})
            database.wake_all()

    def _wake_every_file(self) -> None:
        self.wakeups["sweep"] += 1
        for database in list(self._by_path.values()):
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
