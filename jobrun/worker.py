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
``prune_after`` or a job's ``keep_for``, deletes expired finished runs of the
registered jobs (of the others only with ``prune_unregistered_after``) every
``PRUNE_INTERVAL_S``, in small transactions, away from the drivers.

``stop`` ends the worker gracefully: no new claims, passes in flight finish.
Cancelling the task running :func:`run_worker` cancels those passes too, and
each hands its lease back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobrun._core import orphans
from jobrun._core.clock import Clock
from jobrun._core.drive import drive_due_jobs
from jobrun._core.fair import ClaimTurns
from jobrun._core.formats import format_instant
from jobrun._core.observe import (
    LOG_PASSES,
    PassObserver,
    PassStart,
    PassWatch,
    observe_all,
)
from jobrun._core.options import DriveKeywords, DriveOptions, drive_options
from jobrun._core.records import JobRunHealth, RunKey
from jobrun._core.refusals import checked_count, checked_seconds, refuse, refuse_type
from jobrun._core.registry import JobRegistry
from jobrun._core.retention import check_prune_after, prune_by_retention, retains
from jobrun._entry import SYSTEM_SOURCES, job_run_health, start_scheduled_runs
from jobrun._system import default_driver_name, resolve_clock
from jobrun.errors import describe_exception
from jobrun.sql.store import SqlJobRunStore
from jobrun.sql.tenancy import notify_channel

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("jobrun.worker")

FIRST_IDLE_DELAY_S = 0.05
DEFAULT_INTERVAL_S = 5.0
# How often each database is asked for due runs of jobs this worker does not
# register (never less than the interval): a read of its own, so the claim,
# and an idle database's one claim per interval, stay as they are.
UNREGISTERED_CHECK_S = 60.0
FAILED_DRIVE_RETRY_S = 1.0
"""How soon a driver whose drive failed tries again (never later than the interval)."""
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

    def __init__(self, store: SqlJobRunStore, clock: Clock) -> None:
        self.store = store
        self.engine = store.engine
        self.clock = clock
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
        options: DriveOptions,
        *,
        interval_s: float,
        concurrency: int,
        on_health: HealthCallback | None,
        stop: asyncio.Event,
        clock: Clock,
        prune_after: timedelta | None,
        prune_unregistered_after: timedelta | None = None,
    ) -> None:
        self.databases = databases
        self.registry = registry
        self.options = options
        self.interval_s = interval_s
        self.concurrency = concurrency
        self.on_health = on_health
        self.stop = stop
        self.driver_name = options.driver_name or default_driver_name()
        self.clock = clock
        self.prune_after = check_prune_after(prune_after)
        unregistered = check_prune_after(prune_unregistered_after, "prune_unregistered_after")
        self.prune_unregistered_after = unregistered
        self.slots = asyncio.Semaphore(concurrency)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._stopper())
            for database in self.databases:
                base = LOG_PASSES if self.options.observer is None else self.options.observer
                observer = observe_all(base, _WakeSiblings(database))
                for number in range(self.concurrency):
                    group.create_task(self._drive(database, observer, number))
                if self.on_health is not None:
                    group.create_task(self._health(database, self.on_health))
                if _listens(database.engine):
                    group.create_task(self._listen(database))
                group.create_task(self._watch_unregistered(database))
                if self.registry.schedules():
                    group.create_task(self._schedule(database))
                else:
                    group.create_task(self._forget_schedules(database))
                if retains(self.registry, self.prune_after, self.prune_unregistered_after):
                    group.create_task(self._prune(database))

    async def _stopper(self) -> None:
        await self.stop.wait()
        for database in self.databases:
            database.wake_all()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(seconds):
                await self.stop.wait()

    async def _repeat(
        self,
        round_: Callable[[], Awaitable[float | None]],
        failed: Callable[[Exception], float],
    ) -> None:
        """Run ``round_`` until the worker stops, sleeping after each round (on the
        worker's clock; a stop ends the sleep) the seconds it returned (``None``: no
        sleep). A round that raises is logged by ``failed``, which says how long to
        sleep before the next."""
        while not self.stop.is_set():
            try:
                wait_s = await round_()
            except Exception as error:
                wait_s = failed(error)
            if wait_s is not None:
                await self._sleep(wait_s)

    async def _drive(self, database: _Database, observer: PassObserver, number: int) -> None:
        driver = f"{self.driver_name}/{number}" if self.concurrency > 1 else self.driver_name
        # Made once per driver: its name, the observer that wakes its siblings, the clock.
        options = replace(self.options, driver_name=driver, observer=observer, clock=self.clock)
        # Its own count of claims, kept across rounds: one in FAIR_EVERY goes by age.
        turns = ClaimTurns()
        await self._repeat(
            functools.partial(self._drive_round, database, options, turns),
            functools.partial(self._drive_failed, database),
        )

    async def _drive_round(
        self, database: _Database, options: DriveOptions, turns: ClaimTurns
    ) -> float | None:
        """One drive of the due runs, then, if it found none, a wait for more."""
        database.pending = False
        try:
            async with self.slots:
                if self.stop.is_set():
                    return None
                report = await drive_due_jobs(
                    database.store,
                    self.registry,
                    options,
                    SYSTEM_SOURCES,
                    stop=self.stop,
                    on_user_exit=functools.partial(_log_user_exit, database),
                    turns=turns,
                )
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if task is None or task.cancelling() > 0:
                raise
            # Nobody cancelled this driver: left to go on, it would end without a
            # word (a task group ignores a child's CancelledError), and drive nothing.
            return self._drive_failed(database, error)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as error:
            # A BaseException class of the job's own stopped its pass (the lease was
            # handed back): logged like a failed drive, and the worker goes on.
            return self._drive_failed(database, error)
        database.failing_since = None
        if report.attempted:
            database.delay_s = FIRST_IDLE_DELAY_S
        elif not self.stop.is_set():
            # (Stopped while driving: the stopper's wake-up may have come and gone
            # already, so waiting now could wait forever.)
            await self._wait_for_work(database)
        return None

    async def _wait_for_work(self, database: _Database) -> None:
        if database.polling:
            # Another driver polls this database: wait until something wakes us.
            await database.idle(None)
            return
        database.polling = True
        try:
            delay = database.delay_s
            database.delay_s = min(self.interval_s, delay * 2)
            if orphans.leases_held(database.store):
                # Another holder may die: look often enough to take over in time.
                delay = min(delay, orphans.SCAN_INTERVAL_S)
            await database.idle(delay)
        finally:
            database.polling = False

    def _drive_failed(self, database: _Database, error: BaseException) -> float:
        """Log a failed drive; the seconds to wait before the next.

        The next try comes soon (the store may answer again any moment, and the
        runs whose release it failed wait for it: see ``jobrun._core.owed``); the
        warning comes when a streak of failures begins and once per interval after.
        """
        now = self.clock.monotonic()
        retry_s = min(self.interval_s, FAILED_DRIVE_RETRY_S)
        if database.failing_since is None or now - database.warned_at >= self.interval_s:
            database.warned_at = now
            level = logging.WARNING
        else:
            level = logging.DEBUG
        if database.failing_since is None:
            database.failing_since = now
        log.log(
            level,
            "driving %s failed: %s; trying again in %.1f s",
            database.label,
            describe_exception(error),
            retry_s,
            exc_info=True,
            extra={"database": database.label},
        )
        return retry_s

    async def _health(self, database: _Database, record: HealthCallback) -> None:
        async def read() -> float:
            record(database.label, await job_run_health(database.store))
            return self.interval_s

        failed = _warning(database, "reading the health of %s failed: %s", self.interval_s)
        await self._repeat(read, failed)

    async def _watch_unregistered(self, database: _Database) -> None:
        """Warn, once per job per check, about due runs no driver here can take."""
        wait_s = max(self.interval_s, UNREGISTERED_CHECK_S)

        async def look() -> float:
            due = await database.store.due_by_job(format_instant(self.clock.now()))
            for (module_id, job), count in sorted(due.items()):
                if (module_id, job) not in self.registry:
                    _warn_unregistered(database, module_id, job, count)
            return wait_s

        def failed(error: Exception) -> float:
            log.debug("reading due runs per job on %s failed: %s", database.label, error)
            return wait_s

        await self._repeat(look, failed)

    async def _schedule(self, database: _Database) -> None:
        """Start each due slot's run, then sleep until the next slot."""
        schedules = self.registry.schedules()

        async def start() -> float:
            if await start_scheduled_runs(database.store, self.registry, clock=self.clock):
                database.wake_all()
            now = self.clock.now()
            upcoming = min(schedule.next_slot(now) for schedule in schedules)
            return min(MAX_SCHEDULE_SLEEP_S, (upcoming - now).total_seconds())

        message = "starting the scheduled runs of %s failed: %s; trying again in %.1f s"
        await self._repeat(start, _warning(database, message, self.interval_s, self.interval_s))

    async def _forget_schedules(self, database: _Database) -> None:
        """No schedules here: forget, once, those that this registry's jobs had (a
        registry that schedules nothing starts nothing, so once at start suffices)."""
        try:
            await start_scheduled_runs(database.store, self.registry, clock=self.clock)
        except Exception as error:
            _warning(database, "forgetting the removed schedules of %s failed: %s", 0.0)(error)

    async def _prune(self, database: _Database) -> None:
        async def prune() -> float:
            deleted = await prune_by_retention(
                database.store,
                self.registry,
                prune_after=self.prune_after,
                prune_unregistered_after=self.prune_unregistered_after,
                sources=SYSTEM_SOURCES,
            )
            if deleted:
                log.info(
                    "pruned %d finished runs of %s",
                    deleted,
                    database.label,
                    extra={"database": database.label, "deleted": deleted},
                )
            return PRUNE_INTERVAL_S

        await self._repeat(prune, _warning(database, "pruning %s failed: %s", PRUNE_INTERVAL_S))

    def _wanted(self, payload: str) -> bool:
        try:
            module_id, job = json.loads(payload)
        except (ValueError, TypeError):
            return True
        return (module_id, job) in self.registry

    async def _listen(self, database: _Database) -> None:
        """LISTEN for new runs on a connection of its own; reconnect when it is lost."""

        async def listen() -> float:
            await self._listen_once(database)
            return self.interval_s

        message = "listening on %s failed: %s; polling every %.1f s meanwhile"
        await self._repeat(listen, _warning(database, message, self.interval_s, self.interval_s))

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
        store = database.store
        await store.on_presence_connection(lambda raw: raw.add_listener(database.channel, notified))
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
            await store.on_presence_connection(
                lambda raw: raw.remove_listener(database.channel, notified)
            )


def _warning(
    database: _Database, message: str, wait_s: float, *more: object
) -> Callable[[Exception], float]:
    """A loop's failure: logged as a warning (``message`` of the database, the error and
    ``more``), then ``wait_s`` before the next round."""

    def failed(error: Exception) -> float:
        log.warning(message, database.label, error, *more, extra={"database": database.label})
        return wait_s

    return failed


def _warn_unregistered(database: _Database, module_id: str, job: str, count: int) -> None:
    log.warning(
        "%d due run(s) of job %r of module %r on %s wait for a driver: this "
        "worker does not register that job (register it, or cancel the runs)",
        count,
        job,
        module_id,
        database.label,
        extra={"database": database.label, "module_id": module_id, "job": job},
    )


def _log_user_exit(
    database: _Database, run: RunKey, raised: KeyboardInterrupt | SystemExit
) -> None:
    """A job's own code raised ``KeyboardInterrupt`` or ``SystemExit``: the worker goes on."""
    log.error(
        "run %s of %s/%s[%s] on %s raised %s in its own code; recorded as a failed "
        "attempt of the run, and this worker goes on with other runs",
        run.id,
        run.module_id,
        run.job,
        run.instance,
        database.label,
        describe_exception(raised),
        extra={"database": database.label, "run_id": run.id},
    )


def _listens(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"


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
    **keywords: Unpack[DriveKeywords],
) -> None:
    """Drive the due runs of every database in ``databases`` until ``stop`` is set.

    ``databases`` are URLs (an engine is made for each and disposed of at the end),
    engines (left to their owner) or :class:`jobrun.SqlJobRunStore` instances (used
    as they are, with their own schema and settings). Each database's schema is
    checked first, so a database that was never upgraded fails here, not later.

    ``options`` (a :class:`jobrun.DriveOptions`, or its fields as keywords) go to
    each :func:`jobrun.run_due_jobs` call; its ``clock`` also times the worker's
    waits. ``concurrency`` bounds the calls in flight across all databases.
    ``on_health(database, health)`` gets :func:`jobrun.job_run_health` of each
    database every ``interval_s``. A failing database is retried after a second
    (at most ``interval_s``) and never stops the others; a job's ``sys.exit()``
    is its run's failed attempt, logged. On Postgres, ``schema`` is the tenant's
    schema of every URL and engine (see ``SqlJobRunStore(schema=...)``).
    A bad value raises :class:`jobrun.JobValidationError` before any database is used.

    Schedules: see :func:`jobrun.start_scheduled_runs`. ``prune_after`` prunes the
    registry's jobs (``keep_for`` wins), ``prune_unregistered_after`` the others.
    """
    chosen = _worker_options(options, keywords)
    if not databases:
        raise refuse("databases", "must name at least one database: run_worker needs one")
    if not isinstance(registry, JobRegistry):
        raise refuse_type("registry", f"must be a JobRegistry, got {type(registry).__name__}")
    timing = resolve_clock(chosen.clock)
    worker = _Worker(
        [],
        registry,
        chosen,
        interval_s=checked_seconds(interval_s, "interval_s"),
        concurrency=checked_count(concurrency, "concurrency"),
        on_health=on_health,
        stop=stop if stop is not None else asyncio.Event(),
        clock=timing,
        prune_after=prune_after,
        prune_unregistered_after=prune_unregistered_after,
    )
    async with contextlib.AsyncExitStack() as owned:
        for database in databases:
            store = _store_of(database, schema, owned)
            worker.databases.append(_Database(store, timing))
        for state in worker.databases:
            # The schema check (and a first connection) before any driver starts.
            await job_run_health(state.store)
        await _run_logged(worker)


def _worker_options(options: DriveOptions | None, keywords: DriveKeywords) -> DriveOptions:
    chosen = drive_options(options, keywords)
    if chosen.watchdog is None:
        # The worker's process is jobrun's own: a body that cannot be stopped ends it.
        chosen = replace(chosen, watchdog=True)
    return chosen


def _store_of(
    database: Database, schema: str | None, owned: contextlib.AsyncExitStack
) -> SqlJobRunStore:
    """The store for one of ``databases``; an engine made from a URL is disposed of on exit."""
    if isinstance(database, SqlJobRunStore):
        if schema is not None and database.schema != schema:
            raise refuse(
                "schema",
                f"is {schema!r} but a store given is in schema {database.schema!r}: "
                "a store keeps its own schema",
            )
        return database
    if isinstance(database, str):
        engine = create_async_engine(make_url(database))
        owned.push_async_callback(engine.dispose)
        return SqlJobRunStore(engine, schema=schema)
    if isinstance(database, AsyncEngine):
        return SqlJobRunStore(database, schema=schema)
    raise refuse_type(
        "databases",
        f"must each be a URL, an AsyncEngine or a SqlJobRunStore, got {type(database).__name__}",
        message="a database is a URL, an AsyncEngine or a SqlJobRunStore, "
        f"got {type(database).__name__}",
    )


async def _run_logged(worker: _Worker) -> None:
    labels = [state.label for state in worker.databases]
    began = worker.clock.monotonic()
    log.info(
        "worker started on %s (%d jobs, concurrency %d, interval %.1f s)",
        ", ".join(labels),
        len(worker.registry),
        worker.concurrency,
        worker.interval_s,
        extra={"databases": labels},
    )
    try:
        await worker.run()
    finally:
        log.info(
            "worker stopped after %.1f s",
            worker.clock.monotonic() - began,
            extra={"databases": labels},
        )
