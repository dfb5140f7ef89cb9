"""The worker: drive the due runs of one or more databases until told to stop.

:func:`run_worker` checks its arguments once (:class:`WorkerSettings`) and hands
them to the worker's parts, each owning its state: the drivers of each database
(:mod:`jobrun.worker.driving`: ``concurrency`` per database, at most
``concurrency`` passes in flight across all), their upkeep (schedules,
retention, health: :mod:`jobrun.worker.upkeep`), the LISTEN on Postgres
(:mod:`jobrun.worker.listen`), the set of databases with its reloads and turns
(:mod:`jobrun.worker.turns`), and the worker's row in each database
(:mod:`jobrun.worker.registration`). The worker here starts each database's
tasks and ends them.

An idle database costs one claim query per interval, or nothing until woken
where it can be: by inotify on SQLite (:mod:`jobrun.worker.wakeups`), and on
Postgres by ``LISTEN jobrun_started`` on the store's presence connection (its
own, not one of the pool's; see ``jobrun.sql.postgres.presence``), which
``start_job_run`` notifies.

``stop`` ends the worker gracefully: no new claims, passes in flight finish.
Cancelling the task running :func:`run_worker` cancels those passes too, and
each hands its lease back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from jobrun._core import (
    LOG_PASSES,
    DriveKeywords,
    DriveOptions,
    JobRegistry,
    check_prune_after,
    checked_count,
    checked_seconds,
    drive_options,
    observe_all,
    refuse,
    refuse_type,
    retains,
)
from jobrun._host import default_driver_name, resolve_clock
from jobrun.sql.postgres.kept_connections import keep_at_most
from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.database import ServedDatabase, WakeSiblings
from jobrun.worker.driving import Drivers
from jobrun.worker.listen import Listener, listens
from jobrun.worker.registration import DEFAULT_HEARTBEAT_S, Registration
from jobrun.worker.settings import (
    CONNECT_TIMEOUT_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_CONNECTIONS_PER_DATABASE,
    HealthCallback,
    WorkerSettings,
)
from jobrun.worker.start import first_read, keep_on_given
from jobrun.worker.turns import ServedSet
from jobrun.worker.upkeep import Upkeep
from jobrun.worker.wakeups import DEFAULT_MAX_OPEN_SQLITE, OpenStores, WriteWatch

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("jobrun.worker")


class _Worker:
    """One worker: its parts, and the tasks of each database it serves."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.open_stores = OpenStores(settings.max_open_sqlite)
        # What woke idle databases, by cause (for logs, metrics and tests).
        self.wakeups: collections.Counter[str] = collections.Counter()
        self.served = ServedSet(settings, self.wakeups, self._serve, self._database_tasks)
        self.upkeep = Upkeep(settings, self.open_stores)
        self.drivers = Drivers(settings, self.open_stores, self.wakeups, self.upkeep)
        self.listener = Listener(
            settings.registry, settings.interval_s, settings.clock, self.wakeups
        )
        self.registration = Registration(
            settings.registry,
            settings.driver_name,
            settings.clock,
            settings.heartbeat_s,
            served=lambda: len(self.served.databases),
        )
        self._writes: WriteWatch | None = None

    async def run(self, reloads: asyncio.Queue[Sequence[Database]] | None = None) -> None:
        self._writes = WriteWatch(self.served.written, self.served.wake_every_file)
        try:
            async with asyncio.TaskGroup() as group:
                self.served.group = group
                group.create_task(self._stopper())
                if reloads is not None:
                    group.create_task(self.served.reload(reloads))
                for database in self.served.databases:
                    group.create_task(self._serve(database))
        finally:
            self._writes.close()

    async def _serve(self, database: ServedDatabase) -> None:
        """Every task of one database, until the worker stops or the database is dropped."""
        by_path = self.served.by_path
        if database.path is not None and self._writes is not None:
            database.watched = self._writes.add(database.path)
            by_path[database.path] = database
        if database.path is not None and database.owned:
            self.open_stores.manage(database.engine)
        try:
            if self.settings.max_databases is None:
                async with asyncio.TaskGroup() as group:
                    self._database_tasks(database, group)
            else:
                await self.served.serve_in_turns(database)
        finally:
            if by_path.get(database.path) is database:  # type: ignore[arg-type]
                del by_path[database.path]  # type: ignore[arg-type]
            if database.owned:
                await self.open_stores.forget(database.engine)
                await database.engine.dispose()

    def _database_tasks(self, database: ServedDatabase, group: asyncio.TaskGroup) -> None:
        settings, upkeep = self.settings, self.upkeep
        base = LOG_PASSES if settings.options.observer is None else settings.options.observer
        observer = observe_all(base, WakeSiblings(database))
        for number in range(settings.concurrency):
            group.create_task(self.drivers.drive(database, observer, number))
        # Its row in the database: seen by the console and health while idle.
        group.create_task(self.registration.keep(database, self._opened))
        if settings.on_health is not None:
            group.create_task(upkeep.health(database, settings.on_health))
        if listens(database.engine):
            database.awaiting_listen = True
            group.create_task(self.listener.listen(database))
        # A database that can be woken (inotify, LISTEN) is looked at for unregistered
        # jobs when a drive of it takes nothing, and forgets removed schedules at its
        # first drive: nothing at start-up for each of a thousand databases.
        database.lazy = database.watched or database.awaiting_listen
        if not database.lazy:
            group.create_task(upkeep.watch_unregistered(database))
        if settings.registry.schedules():
            group.create_task(upkeep.schedule(database))
        elif not database.lazy:
            group.create_task(upkeep.forget_schedules(database))
        if retains(settings.registry, settings.prune_after, settings.prune_unregistered_after):
            group.create_task(upkeep.prune(database))

    def _opened(self, database: ServedDatabase) -> contextlib.AbstractAsyncContextManager[None]:
        return self.open_stores.use(database.engine)

    async def _stopper(self) -> None:
        await self.settings.stop.wait()
        for database in self.served.databases:
            database.gone.set()
            database.stop.set()
            database.wake_all()


def _loop_name() -> str:
    """``asyncio`` or ``uvloop`` (``jobrun worker --loop auto`` takes uvloop when installed)."""
    return type(asyncio.get_running_loop()).__module__.split(".", 1)[0]


Database: TypeAlias = str | AsyncEngine | SqlJobRunStore
"""What :func:`run_worker` drives: a URL, an engine, or a store."""


async def run_worker(
    databases: Sequence[Database],
    registry: JobRegistry,
    *,
    options: DriveOptions | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    concurrency: int = 1,
    on_health: HealthCallback | None = None,
    stop: asyncio.Event | None = None,
    prune_after: timedelta | None = None,
    prune_unregistered_after: timedelta | None = None,
    schema: str | None = None,
    max_open_sqlite: int = DEFAULT_MAX_OPEN_SQLITE,
    max_connections_per_database: int = DEFAULT_MAX_CONNECTIONS_PER_DATABASE,
    max_databases: int | None = None,
    reloads: asyncio.Queue[Sequence[Database]] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    **keywords: Unpack[DriveKeywords],
) -> None:
    """Drive the due runs of every database in ``databases`` until ``stop`` is set.

    ``databases`` are URLs (an engine is made for each, disposed of at the end),
    engines (left to their owner) or :class:`jobrun.SqlJobRunStore` instances (as
    they are). Each database's schema is checked first: never upgraded fails here.
    ``options`` (a :class:`jobrun.DriveOptions`, or its fields as keywords) go to
    each :func:`jobrun.run_due_jobs` call; its ``clock`` also times the worker's
    waits. ``concurrency`` bounds the calls in flight across all databases.
    ``on_health(database, health)`` gets :func:`jobrun.job_run_health` of each
    database every ``interval_s``. A failing database is retried after a second (at
    most ``interval_s``), never stopping the others; a job's ``sys.exit()`` is a
    failed attempt. ``schema``: the tenant's Postgres schema (``SqlJobRunStore``).
    A bad value raises :class:`jobrun.JobValidationError` before any database is
    used. ``prune_after`` prunes the registry's jobs (``keep_for`` wins),
    ``prune_unregistered_after`` the others.

    ``max_connections_per_database`` bounds jobrun's connections on each Postgres
    database (engines and stores handed in too); a first read that fails at start is
    retried with a doubling delay. Many databases (docs/how-to/many-drivers.md):
    ``max_open_sqlite``, ``max_databases``, and ``reloads`` (each list put on it is
    the set served). The worker registers in each database every ``heartbeat_s``.
    """
    chosen = _worker_options(options, keywords)
    _check_what_to_drive(databases, registry)
    # Checked in this order: a call with two bad values is refused for the first.
    settings = WorkerSettings(
        registry=registry,
        options=chosen,
        interval_s=checked_seconds(interval_s, "interval_s"),
        concurrency=checked_count(concurrency, "concurrency"),
        on_health=on_health,
        stop=stop if stop is not None else asyncio.Event(),
        clock=resolve_clock(chosen.clock),
        max_open_sqlite=checked_count(max_open_sqlite, "max_open_sqlite"),
        max_databases=max_databases and checked_count(max_databases, "max_databases"),
        heartbeat_s=checked_seconds(heartbeat_s, "heartbeat_s"),
        driver_name=chosen.driver_name or default_driver_name(),
        prune_after=check_prune_after(prune_after),
        prune_unregistered_after=check_prune_after(
            prune_unregistered_after, "prune_unregistered_after"
        ),
        schema=schema,
    )
    worker = _Worker(settings)
    keep = checked_count(max_connections_per_database, "max_connections_per_database")
    await _serve_all(worker, databases, keep, reloads)


def _check_what_to_drive(databases: Sequence[Database], registry: JobRegistry) -> None:
    if not databases:
        raise refuse("databases", "must name at least one database: run_worker needs one")
    if not isinstance(registry, JobRegistry):
        raise refuse_type("registry", f"must be a JobRegistry, got {type(registry).__name__}")


async def _serve_all(
    worker: _Worker,
    databases: Sequence[Database],
    keep: int,
    reloads: asyncio.Queue[Sequence[Database]] | None,
) -> None:
    settings, served = worker.settings, worker.served
    async with contextlib.AsyncExitStack() as owned:

        def make(database: Database) -> ServedDatabase:
            store = _store_of(database, settings.schema, owned, keep)
            return ServedDatabase(store, settings.clock, owned=isinstance(database, str))

        served.make_database = make
        served.databases.extend(make(database) for database in databases)
        if reloads is None:
            for state in served.databases:
                # The schema check (and a first connection) before any driver starts.
                await first_read(state, settings.clock, settings.stop, settings.interval_s)
        await _run_logged(worker, reloads)


def _worker_options(options: DriveOptions | None, keywords: DriveKeywords) -> DriveOptions:
    chosen = drive_options(options, keywords)
    if chosen.watchdog is None:
        # The worker's process is jobrun's own: a body that cannot be stopped ends it.
        chosen = replace(chosen, watchdog=True)
    return chosen


def _store_of(
    database: Database, schema: str | None, owned: contextlib.AsyncExitStack, keep: int
) -> SqlJobRunStore:
    """The store for one of ``databases``; an engine made from a URL is disposed of on exit."""
    if isinstance(database, SqlJobRunStore):
        if schema is not None and database.schema != schema:
            raise refuse(
                "schema",
                f"is {schema!r} but a store given is in schema {database.schema!r}: "
                "a store keeps its own schema",
            )
        keep_on_given(database.engine, keep)
        return database
    if isinstance(database, str):
        url = make_url(database)
        postgres = url.get_backend_name() == "postgresql"
        # No pool: an idle database holds no connection (Postgres: its presence only).
        connect_args = {"timeout": CONNECT_TIMEOUT_S} if postgres else {}
        engine = create_async_engine(url, poolclass=NullPool, connect_args=connect_args)
        if postgres:
            keep_at_most(engine, keep)
        owned.push_async_callback(engine.dispose)
        return SqlJobRunStore(engine, schema=schema)
    if isinstance(database, AsyncEngine):
        keep_on_given(database, keep)
        return SqlJobRunStore(database, schema=schema)
    raise refuse_type(
        "databases",
        f"must each be a URL, an AsyncEngine or a SqlJobRunStore, got {type(database).__name__}",
        message="a database is a URL, an AsyncEngine or a SqlJobRunStore, "
        f"got {type(database).__name__}",
    )


async def _run_logged(worker: _Worker, reloads: Any) -> None:
    settings = worker.settings
    labels = [state.label for state in worker.served.databases]
    began = settings.clock.monotonic()
    shown = ", ".join(labels) if len(labels) <= 5 else f"{len(labels)} databases"
    log.info(
        "worker started on %s (%d jobs, concurrency %d, interval %.1f s, event loop: %s)",
        shown,
        len(settings.registry),
        settings.concurrency,
        settings.interval_s,
        _loop_name(),
        extra={"databases": labels},
    )
    try:
        await worker.run(reloads)
    finally:
        log.info(
            "worker stopped after %.1f s",
            settings.clock.monotonic() - began,
            extra={"databases": labels},
        )
