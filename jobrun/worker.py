"""The worker: drive the due runs of one or more databases until told to stop.

Per database, ``concurrency`` drivers call :func:`jobrun.run_due_jobs` in a
loop; one semaphore keeps at most ``concurrency`` of those calls (so passes) in
flight across all databases. Leases make several drivers on one database safe.

When a database has nothing due, one of its drivers polls (one claim query)
after a delay that doubles from 50 ms up to ``interval_s``, while the others
wait to be woken: an idle database costs one claim query per interval. A
driver that starts a pass wakes one idle sibling, so work spreads out as it
appears. On Postgres the store's presence connection (its own, not one of the pool's;
see ``jobrun.sql.presence``) also waits on ``LISTEN jobrun_started``
(``start_job_run`` notifies it) and wakes the database's drivers at once.

Per database, one more task starts the runs of due schedule slots (see
:meth:`jobrun.JobRegistry.schedule`): it sleeps until the next slot, calls
:func:`jobrun.start_scheduled_runs` and wakes the drivers. Another, with
``prune_after`` or a job's ``keep_for``, deletes expired finished runs every
``PRUNE_INTERVAL_S``, in small transactions, away from the drivers.

``stop`` ends the worker gracefully: no new claims, passes in flight finish.
Cancelling the task running :func:`run_worker` cancels those passes too, and
each hands its lease back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobrun._core.actions import job_run_health
from jobrun._core.clock import Clock, ClockLike
from jobrun._core.drive import JOB_DRIVE_LIMIT, run_due_jobs
from jobrun._core.formats import format_instant
from jobrun._core.observe import (
    LOG_PASSES,
    PassObserver,
    PassStart,
    PassWatch,
    observe_all,
)
from jobrun._core.passes import OpenScope
from jobrun._core.records import JobRunHealth
from jobrun._core.registry import JobRegistry
from jobrun._core.retention import check_prune_after, prune_by_retention, retains
from jobrun._core.scheduled_runs import start_scheduled_runs
from jobrun._system import default_driver_name, resolve_clock
from jobrun.sql.store import SqlJobRunStore
from jobrun.sql.tenancy import notify_channel

log = logging.getLogger("jobrun.worker")

FIRST_IDLE_DELAY_S = 0.05
DEFAULT_INTERVAL_S = 5.0
# How often each database is asked for due runs of jobs this worker does not
# register (never less than the interval): a read of its own, so the claim,
# and an idle database's one claim per interval, stay as they are.
UNREGISTERED_CHECK_S = 60.0
PRUNE_INTERVAL_S = 600.0
"""Retention runs at start and then every ten minutes: pruning is never urgent."""
MAX_SCHEDULE_SLEEP_S = 60.0
"""The scheduler looks again at least this often (a clock that jumps is noticed)."""

HealthCallback = Callable[[str, JobRunHealth], None]


def database_label(engine: AsyncEngine) -> str:
    """The engine's URL with its password hidden: how logs and metrics name a database."""
    return engine.url.render_as_string(hide_password=True)


class _Database:
    """One database's drivers: who is idle, who polls, and how long the poller waits."""

    def __init__(
        self, engine: AsyncEngine, label: str, clock: Clock, schema: str | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.label = label if schema is None else f"{label} schema {schema}"
        self.store = SqlJobRunStore(engine, schema=schema)
        # One tenant's starts wake only that tenant's drivers.
        self.channel = notify_channel(schema)
        self.delay_s = FIRST_IDLE_DELAY_S
        self.polling = False
        # A wake-up that found nobody idle: the next driver to go idle claims again.
        self.pending = False
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

    async def idle(self, timeout_s: float | None) -> None:
        """Wait to be woken, or ``timeout_s`` (``None``: only when woken)."""
        if self.pending:
            self.pending = False
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            async with self.clock.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._idle.remove(waiter)


class _WakeSiblings:
    """An observer that wakes one idle driver of the database whenever a pass starts."""

    def __init__(self, database: _Database) -> None:
        self._database = database

    def pass_started(self, start: PassStart) -> PassWatch | None:
        self._database.wake_one()
        return None


class _Worker:
    def __init__(
        self,
        databases: list[_Database],
        registry: JobRegistry,
        *,
        interval_s: float,
        limit: int,
        max_passes: int,
        concurrency: int,
        pass_timeout_s: float | None,
        open_scope: OpenScope | None,
        observer: PassObserver,
        on_health: HealthCallback | None,
        stop: asyncio.Event,
        driver_name: str,
        clock: Clock,
        prune_after: timedelta | None,
    ) -> None:
        self.databases = databases
        self.registry = registry
        self.interval_s = interval_s
        self.limit = limit
        self.max_passes = max_passes
        self.concurrency = concurrency
        self.pass_timeout_s = pass_timeout_s
        self.open_scope = open_scope
        self.observer = observer
        self.on_health = on_health
        self.stop = stop
        self.driver_name = driver_name
        self.clock = clock
        self.prune_after = prune_after
        self.slots = asyncio.Semaphore(concurrency)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._stopper())
            for database in self.databases:
                observer = observe_all(self.observer, _WakeSiblings(database))
                for number in range(self.concurrency):
                    group.create_task(self._drive(database, observer, number))
                if self.on_health is not None:
                    group.create_task(self._health(database, self.on_health))
                if _listens(database.engine):
                    group.create_task(self._listen(database))
                group.create_task(self._watch_unregistered(database))
                if self.registry.schedules():
                    group.create_task(self._schedule(database))
                if retains(self.registry, self.prune_after):
                    group.create_task(self._prune(database))

    async def _stopper(self) -> None:
        await self.stop.wait()
        for database in self.databases:
            database.wake_all()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(seconds):
                await self.stop.wait()

    async def _drive(self, database: _Database, observer: PassObserver, number: int) -> None:
        driver = f"{self.driver_name}/{number}" if self.concurrency > 1 else self.driver_name
        while not self.stop.is_set():
            database.pending = False
            try:
                async with self.slots:
                    if self.stop.is_set():
                        return
                    report = await run_due_jobs(
                        database.store,
                        self.registry,
                        limit=self.limit,
                        max_passes=self.max_passes,
                        open_scope=self.open_scope,
                        pass_timeout_s=self.pass_timeout_s,
                        driver_name=driver,
                        stop=self.stop,
                        observer=observer,
                        clock=self.clock,
                    )
            except Exception as error:
                log.warning(
                    "driving %s failed: %s; trying again in %.1f s",
                    database.label,
                    error,
                    self.interval_s,
                    exc_info=True,
                    extra={"database": database.label},
                )
                await self._sleep(self.interval_s)
                continue
            if report.attempted:
                database.delay_s = FIRST_IDLE_DELAY_S
                continue
            if database.polling:
                # Another driver polls this database: wait until something wakes us.
                await database.idle(None)
                continue
            database.polling = True
            try:
                delay = database.delay_s
                database.delay_s = min(self.interval_s, delay * 2)
                await database.idle(delay)
            finally:
                database.polling = False

    async def _health(self, database: _Database, record: HealthCallback) -> None:
        while not self.stop.is_set():
            try:
                record(database.label, await job_run_health(database.store))
            except Exception as error:
                log.warning(
                    "reading the health of %s failed: %s",
                    database.label,
                    error,
                    extra={"database": database.label},
                )
            await self._sleep(self.interval_s)

    async def _watch_unregistered(self, database: _Database) -> None:
        """Warn, once per job per check, about due runs no driver here can take."""
        while not self.stop.is_set():
            try:
                due = await database.store.due_by_job(format_instant(self.clock.now()))
            except Exception as error:
                log.debug("reading due runs per job on %s failed: %s", database.label, error)
                due = {}
            for (module_id, job), count in sorted(due.items()):
                if (module_id, job) in self.registry:
                    continue
                log.warning(
                    "%d due run(s) of job %r of module %r on %s wait for a driver: this "
                    "worker does not register that job (register it, or cancel the runs)",
                    count,
                    job,
                    module_id,
                    database.label,
                    extra={"database": database.label, "module_id": module_id, "job": job},
                )
            await self._sleep(max(self.interval_s, UNREGISTERED_CHECK_S))

    async def _schedule(self, database: _Database) -> None:
        """Start each due slot's run, then sleep until the next slot."""
        schedules = self.registry.schedules()
        while not self.stop.is_set():
            try:
                if await start_scheduled_runs(database.store, self.registry, clock=self.clock):
                    database.wake_all()
            except Exception as error:
                log.warning(
                    "starting the scheduled runs of %s failed: %s; trying again in %.1f s",
                    database.label,
                    error,
                    self.interval_s,
                    extra={"database": database.label},
                )
                await self._sleep(self.interval_s)
                continue
            now = self.clock.now()
            upcoming = min(schedule.next_slot(now) for schedule in schedules)
            await self._sleep(min(MAX_SCHEDULE_SLEEP_S, (upcoming - now).total_seconds()))

    async def _prune(self, database: _Database) -> None:
        while not self.stop.is_set():
            try:
                deleted = await prune_by_retention(
                    database.store, self.registry, prune_after=self.prune_after
                )
                if deleted:
                    log.info(
                        "pruned %d finished runs of %s",
                        deleted,
                        database.label,
                        extra={"database": database.label, "deleted": deleted},
                    )
            except Exception as error:
                log.warning(
                    "pruning %s failed: %s",
                    database.label,
                    error,
                    extra={"database": database.label},
                )
            await self._sleep(PRUNE_INTERVAL_S)

    def _wanted(self, payload: str) -> bool:
        try:
            module_id, job = json.loads(payload)
        except (ValueError, TypeError):
            return True
        return (module_id, job) in self.registry

    async def _listen(self, database: _Database) -> None:
        """LISTEN for new runs on a connection of its own; reconnect when it is lost."""
        while not self.stop.is_set():
            try:
                await self._listen_once(database)
            except Exception as error:
                log.warning(
                    "listening on %s failed: %s; polling every %.1f s meanwhile",
                    database.label,
                    error,
                    self.interval_s,
                    extra={"database": database.label},
                )
            await self._sleep(self.interval_s)

    async def _listen_once(self, database: _Database) -> None:
        """Listen until the worker stops (returns) or the connection is lost (returns too)."""
        lost = asyncio.Event()

        def notified(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
            if self._wanted(payload):
                database.wake_all()

        # The store's presence connection (see ``jobrun.sql.presence``): a connection
        # of its own, never one of the host's pool, which a small pool could not spare.
        raw = await database.store.presence_connection()
        assert raw is not None

        def on_lost(_connection: Any) -> None:
            lost.set()

        raw.add_termination_listener(on_lost)
        await raw.add_listener(database.channel, notified)
        log.debug("listening for new runs on %s", database.label)
        # Anything started before the LISTEN took effect: look now.
        database.wake_all()
        stopping = asyncio.ensure_future(self.stop.wait())
        losing = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({stopping, losing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            losing.cancel()
            raw.remove_termination_listener(on_lost)
        if lost.is_set():
            log.warning("lost the listening connection to %s", database.label)
            return
        with contextlib.suppress(Exception):
            await raw.remove_listener(database.channel, notified)


def _listens(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"


def _positive_int(value: object, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{argument} must be at least 1, got {value}")
    return value


def _positive_seconds(value: object, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, got {type(value).__name__}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{argument} must be a positive number of seconds, got {value!r}")
    return float(value)


async def run_worker(
    databases: Sequence[str | AsyncEngine],
    registry: JobRegistry,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    limit: int = JOB_DRIVE_LIMIT,
    max_passes: int = 1,
    concurrency: int = 1,
    pass_timeout_s: float | None = None,
    open_scope: OpenScope | None = None,
    observer: PassObserver | None = None,
    on_health: HealthCallback | None = None,
    stop: asyncio.Event | None = None,
    driver_name: str | None = None,
    clock: ClockLike | None = None,
    prune_after: timedelta | None = None,
    schema: str | None = None,
) -> None:
    """Drive the due runs of every database in ``databases`` until ``stop`` is set.

    ``databases`` are URLs (an engine is made for each and disposed of at the end)
    or engines (left to their owner). Each database's schema is checked first, so a
    database that was never upgraded fails here, not later. ``limit``,
    ``max_passes``, ``pass_timeout_s`` and ``open_scope`` are handed to each
    :func:`jobrun.run_due_jobs` call; ``concurrency`` bounds the calls in flight
    across all databases. ``observer`` hears every pass (default: log lines);
    ``on_health(database, health)`` gets :func:`jobrun.job_run_health` of each
    database every ``interval_s``. A failing database is logged and retried every
    ``interval_s``; it never stops the others. On Postgres, ``schema`` is the
    tenant's schema in every database (see ``SqlJobRunStore(schema=...)``).
    ``clock`` (default: the system's) is handed to every drive and times the
    worker's own waits.

    The registry's schedules are started at each slot (once per slot across any
    number of workers). ``prune_after`` deletes finished runs that ended longer
    ago than that (a job's ``keep_for`` wins for its own runs), at start and then
    every ``PRUNE_INTERVAL_S``.
    """
    if not databases:
        raise ValueError("run_worker needs at least one database")
    interval_s = _positive_seconds(interval_s, "interval_s")
    _positive_int(concurrency, "concurrency")
    _positive_int(limit, "limit")
    _positive_int(max_passes, "max_passes")
    if pass_timeout_s is not None:
        _positive_seconds(pass_timeout_s, "pass_timeout_s")
    if not isinstance(registry, JobRegistry):
        raise TypeError(f"registry must be a JobRegistry, got {type(registry).__name__}")
    timing = resolve_clock(clock)
    prune_after = check_prune_after(prune_after)
    owned: list[AsyncEngine] = []
    try:
        engines: list[AsyncEngine] = []
        for database in databases:
            if isinstance(database, AsyncEngine):
                engines.append(database)
            elif isinstance(database, str):
                engine = create_async_engine(make_url(database))
                owned.append(engine)
                engines.append(engine)
            else:
                raise TypeError(
                    f"a database is a URL or an AsyncEngine, got {type(database).__name__}"
                )
        states = [_Database(engine, database_label(engine), timing, schema) for engine in engines]
        for state in states:
            # The schema check (and a first connection) before any driver starts.
            await job_run_health(state.store)
        worker = _Worker(
            states,
            registry,
            interval_s=interval_s,
            limit=limit,
            max_passes=max_passes,
            concurrency=concurrency,
            pass_timeout_s=pass_timeout_s,
            open_scope=open_scope,
            observer=LOG_PASSES if observer is None else observer,
            on_health=on_health,
            stop=stop if stop is not None else asyncio.Event(),
            driver_name=driver_name or default_driver_name(),
            clock=timing,
            prune_after=prune_after,
        )
        began = timing.monotonic()
        log.info(
            "worker started on %s (%d jobs, concurrency %d, interval %.1f s)",
            ", ".join(state.label for state in states),
            len(registry),
            concurrency,
            interval_s,
            extra={"databases": [state.label for state in states]},
        )
        try:
            await worker.run()
        finally:
            log.info(
                "worker stopped after %.1f s",
                timing.monotonic() - began,
                extra={"databases": [state.label for state in states]},
            )
    finally:
        for engine in owned:
            await engine.dispose()
