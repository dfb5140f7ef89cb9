"""The worker: drive the due runs of one or more databases until told to stop.

Per database, ``concurrency`` drivers call :func:`jobrun.run_due_jobs` in a
loop; one semaphore keeps at most ``concurrency`` of those calls (so passes) in
flight across all databases. Leases make several drivers on one database safe.

When a database has nothing due, one of its drivers polls (one claim query)
after a delay that doubles from 50 ms up to ``interval_s``, while the others
wait to be woken: an idle database costs one claim query per interval. A
driver that starts a pass wakes one idle sibling, so work spreads out as it
appears. On Postgres the store's presence connection (its own, not one of the pool's;
see ``jobrun.sql.postgres.presence``) also waits on ``LISTEN jobrun_started``
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
import collections
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from jobrun._api import SYSTEM_SOURCES, job_run_health, start_scheduled_runs
from jobrun._core import (
    LOG_PASSES,
    ClaimTurns,
    Clock,
    DriveKeywords,
    DriveOptions,
    JobRegistry,
    JobRunHealth,
    PassObserver,
    RunKey,
    check_prune_after,
    checked_count,
    checked_seconds,
    drive_due_jobs,
    drive_options,
    format_instant,
    lease_instants,
    observe_all,
    parse_instant,
    prune_by_retention,
    refuse,
    refuse_type,
    retains,
)
from jobrun._core import proof_of_death as orphans
from jobrun._host import default_driver_name, resolve_clock
from jobrun.errors import describe_exception
from jobrun.sql.next_due import postgres_next_due_at, sqlite_next_due_at
from jobrun.sql.postgres.kept_connections import keep_at_most
from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.database import FIRST_IDLE_DELAY_S, ServedDatabase, WakeSiblings
from jobrun.worker.deaths import dead_holder_seen, jobs_of
from jobrun.worker.listen import Listening
from jobrun.worker.registration import DEFAULT_HEARTBEAT_S, Registration
from jobrun.worker.start import first_read, keep_on_given
from jobrun.worker.turns import DatabaseTurns, cannot_make
from jobrun.worker.wakeups import DEFAULT_MAX_OPEN_SQLITE, SWEEP_S, OpenStores, WriteWatch

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("jobrun.worker")

DEFAULT_INTERVAL_S = 5.0
# How often each database is asked for due runs of jobs this worker does not
# register (never less than the interval): a read of its own, so the claim,
# and an idle database's one claim per interval, stay as they are.
UNREGISTERED_CHECK_S = 60.0
DEFAULT_MAX_CONNECTIONS_PER_DATABASE = 2
"""Connections jobrun keeps out at once per Postgres database, on the worker's own
engines and on those handed in (the presence's own connection comes on top)."""
CONNECT_TIMEOUT_S = 10
FAILED_DRIVE_RETRY_S = 1.0
"""How soon a driver whose drive failed tries again (never later than the interval)."""
PRUNE_INTERVAL_S = 600.0
"""Retention runs at start and then every ten minutes: pruning is never urgent."""
MAX_SCHEDULE_SLEEP_S = 60.0
"""The scheduler looks again at least this often (a clock that jumps is noticed)."""

HealthCallback = Callable[[str, JobRunHealth], None]
_Database = ServedDatabase


class _Worker(DatabaseTurns, Listening):
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
        max_open_sqlite: int = DEFAULT_MAX_OPEN_SQLITE,
        max_databases: int | None = None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
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
        self.open_stores = OpenStores(max_open_sqlite)
        # What woke idle databases, by cause (for logs, metrics and tests).
        self.wakeups: collections.Counter[str] = collections.Counter()
        self._by_path: dict[Path, _Database] = {}
        self._writes: WriteWatch | None = None
        self._group: asyncio.TaskGroup | None = None
        self.max_databases = max_databases
        self._serving: set[_Database] = set()
        self.schema: str | None = None
        self.make_database: Callable[[Database], _Database] = cannot_make
        self.registration = Registration(registry, self.driver_name, clock, heartbeat_s)

    async def run(self, reloads: asyncio.Queue[Sequence[Database]] | None = None) -> None:
        self._writes = WriteWatch(self._written, self._wake_every_file)
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self._stopper())
                if reloads is not None:
                    group.create_task(self._reload(reloads))
                for database in self.databases:
                    group.create_task(self._serve(database))
        finally:
            self._writes.close()

    async def _serve(self, database: _Database) -> None:
        """Every task of one database, until the worker stops or the database is dropped."""
        if database.path is not None and self._writes is not None:
            database.watched = self._writes.add(database.path)
            self._by_path[database.path] = database
        if database.path is not None and database.owned:
            self.open_stores.manage(database.engine)
        try:
            if self.max_databases is None:
                async with asyncio.TaskGroup() as group:
                    self._database_tasks(database, group)
            else:
                await self._serve_in_turns(database)
        finally:
            if self._by_path.get(database.path) is database:  # type: ignore[arg-type]
                del self._by_path[database.path]  # type: ignore[arg-type]
            if database.owned:
                await self.open_stores.forget(database.engine)
                await database.engine.dispose()

    def _database_tasks(self, database: _Database, group: asyncio.TaskGroup) -> None:
        base = LOG_PASSES if self.options.observer is None else self.options.observer
        observer = observe_all(base, WakeSiblings(database))
        for number in range(self.concurrency):
            group.create_task(self._drive(database, observer, number))
        # Its row in the database: seen by the console and health while idle.
        group.create_task(self.registration.keep(database, self._opened))
        if self.on_health is not None:
            group.create_task(self._health(database, self.on_health))
        if _listens(database.engine):
            database.awaiting_listen = True
            group.create_task(self._listen(database))
        # A database that can be woken (inotify, LISTEN) is looked at for unregistered
        # jobs when a drive of it takes nothing, and forgets removed schedules at its
        # first drive: nothing at start-up for each of a thousand databases.
        database.lazy = database.watched or database.awaiting_listen
        if not database.lazy:
            group.create_task(self._watch_unregistered(database))
        if self.registry.schedules():
            group.create_task(self._schedule(database))
        elif not database.lazy:
            group.create_task(self._forget_schedules(database))
        if retains(self.registry, self.prune_after, self.prune_unregistered_after):
            group.create_task(self._prune(database))

    def _opened(self, database: _Database) -> contextlib.AbstractAsyncContextManager[None]:
        return self.open_stores.use(database.engine)

    async def _stopper(self) -> None:
        await self.stop.wait()
        for database in self.databases:
            database.gone.set()
            database.stop.set()
            database.wake_all()

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            async with self.clock.timeout(seconds):
                await stop.wait()

    async def _repeat(
        self,
        database: _Database,
        round_: Callable[[], Awaitable[float | None]],
        failed: Callable[[Exception], float],
    ) -> None:
        """Run ``round_`` until the database's stop, sleeping after each round (on the
        worker's clock; a stop ends the sleep) the seconds it returned (``None``: no
        sleep). A round that raises is logged by ``failed``, which says how long to
        sleep before the next."""
        while not database.stop.is_set():
            try:
                wait_s = await round_()
            except Exception as error:
                wait_s = failed(error)
            if wait_s is not None:
                await self._sleep(wait_s, database.stop)

    async def _drive(self, database: _Database, observer: PassObserver, number: int) -> None:
        driver = f"{self.driver_name}/{number}" if self.concurrency > 1 else self.driver_name
        # Made once per driver: its name, the observer that wakes its siblings, the clock.
        options = replace(self.options, driver_name=driver, observer=observer, clock=self.clock)
        # Its own count of claims, kept across rounds: one in FAIR_EVERY goes by age.
        turns = ClaimTurns()
        await self._repeat(
            database,
            functools.partial(self._drive_round, database, options, turns),
            functools.partial(self._drive_failed, database),
        )

    async def _drive_round(
        self, database: _Database, options: DriveOptions, turns: ClaimTurns
    ) -> float | None:
        """One drive of the due runs, then, if it found none, a wait for more. A
        woken database is driven only when its probe finds something due."""
        database.pending = False
        # Writes this process still owes (a release the store refused) go first:
        # the probe cannot see them, and the next drive sends them again.
        owing = len(database.store.owed_releases) > 0
        if database.awaiting_listen and not owing:
            # (A LISTEN that takes longer than the interval: drive without it.)
            if not await database.idle(self.interval_s):
                database.awaiting_listen = False
            return None
        if database.woken and not owing and not await self._due_now(database):
            return None
        try:
            async with self.slots, self.open_stores.use(database.engine):
                if database.stop.is_set():
                    return None
                report = await self._drive_once(database, options, turns)
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
        elif not database.stop.is_set():
            # (Stopped while driving: the stopper's wake-up may have come and gone
            # already, so waiting now could wait forever.)
            await self._wait_for_work(database)
        return None

    async def _drive_once(
        self, database: _Database, options: DriveOptions, turns: ClaimTurns
    ) -> Any:
        if database.lazy and not database.schedules_forgotten:
            database.schedules_forgotten = True
            await self._forget_schedules(database)
        report = await drive_due_jobs(
            database.store,
            self.registry,
            options,
            SYSTEM_SOURCES,
            stop=database.stop,
            on_user_exit=functools.partial(_log_user_exit, database),
            turns=turns,
        )
        checked_at = database.unregistered_checked_at
        looked_lately = (
            checked_at is not None and self.clock.monotonic() - checked_at < UNREGISTERED_CHECK_S
        )
        if database.lazy and not report.attempted and not looked_lately:
            await self.look_for_unregistered(database)
        return report

    async def _due_now(self, database: _Database) -> bool:
        """A woken database: whether to drive it now (a run is due, or the holder of
        one is proven dead); if not, wait (until the next due instant, the next look
        for a dead holder, a wake-up or the sweep) and say no."""
        try:
            due_in_s = await self._due_in_s(database)
        except Exception as error:
            # Drive it: the drive says what is wrong, in the usual way.
            log.debug("reading when %s is next due failed: %s", database.label, error)
            return True
        if due_in_s is not None and due_in_s <= 0:
            return True
        now_s = self.clock.monotonic()
        # The sweep's instant stands across the looks' waits: a missed wake-up is
        # still found within SWEEP_S, however long the lease being looked at.
        due_at_s, sweep_at_s = None if due_in_s is None else now_s + due_in_s, now_s + SWEEP_S
        while True:
            looked_at = database.writes_seen
            wait = await self._look_for_the_dead(database, due_at_s, sweep_at_s)
            if wait is None:
                return True
            timeout_s, looking = wait
            database.delay_s = FIRST_IDLE_DELAY_S
            if database.polling:
                await database.idle(None)
                return False
            database.polling = True
            try:
                woken = await database.idle(timeout_s)
            finally:
                database.polling = False
            # SQLite woken by the look's own timer, nothing written since: the due
            # instant stands, and the look re-judges the leases it read (pid checks).
            if woken or not looking or database.path is None:
                break
            if database.writes_seen != looked_at:
                break
        if not woken:
            self.wakeups["timer"] += 1
        return False

    async def _look_for_the_dead(
        self, database: _Database, due_at_s: float | None, sweep_at_s: float
    ) -> tuple[float, bool] | None:
        """``None``: a holder of a live run is proven dead, drive now; else how long
        to wait (until the due instant ``due_at_s``, the sweep at ``sweep_at_s``, both
        monotonic, or the next look) and whether that is the next look's wait. See
        jobrun.worker.deaths."""
        jobs, owed = jobs_of(self.registry), False
        if due_at_s is not None:
            # Live runs, none due: one may be leased by a holder that died (a leased
            # run is due only at its expiry).
            host, listens = SYSTEM_SOURCES.host, _listens(database.engine)
            dead, owed = await dead_holder_seen(database, jobs, self.clock, host, listens=listens)
            if dead:
                return None
        now_s = self.clock.monotonic()
        timeout_s = (sweep_at_s if due_at_s is None else min(due_at_s, sweep_at_s)) - now_s
        look_s = orphans.look_again_in_s(database.store, jobs, now_s, owed=owed)
        if look_s is not None and look_s < timeout_s:
            return look_s, True
        return max(0.0, timeout_s), False

    async def _due_in_s(self, database: _Database) -> float | None:
        """Seconds until the database's next run comes due (``None``: no live run)."""
        if database.path is not None:
            due_at = sqlite_next_due_at(database.path)
        else:
            due_at = await postgres_next_due_at(database.store)
        if due_at is None:
            return None
        # Judged as the claim judges it: after a wall-clock step a live lease must not
        # look due here while the claim (rightly) passes it over, in a loop.
        now, _ = lease_instants(self.clock)
        return (parse_instant(due_at) - now).total_seconds()

    async def _wait_for_work(self, database: _Database) -> None:
        if database.polling:
            # Another driver polls this database: wait until something wakes us.
            await database.idle(None)
            return
        database.polling = True
        try:
            delay = database.delay_s
            database.delay_s = min(self.interval_s, delay * 2)
            # Another process's holder may die: the next drive's claim scans again
            # (once its last scan is SCAN_INTERVAL_S old) and takes over in time.
            now_s = self.clock.monotonic()
            jobs = jobs_of(self.registry)
            look_s = orphans.look_again_in_s(
                database.store, jobs, now_s, every_s=orphans.SCAN_INTERVAL_S
            )
            await database.idle(delay if look_s is None else min(delay, look_s))
        finally:
            database.polling = False

    def _drive_failed(self, database: _Database, error: BaseException) -> float:
        """Log a failed drive; the seconds to wait before the next.

        The next try comes soon (the store may answer again any moment, and the
        runs whose release it failed wait for it: see ``jobrun._core.leases.owed_releases``); the
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
            async with self.open_stores.use(database.engine):
                record(database.label, await job_run_health(database.store))
            return self.interval_s

        failed = _warning(database, "reading the health of %s failed: %s", self.interval_s)
        await self._repeat(database, read, failed)

    async def _watch_unregistered(self, database: _Database) -> None:
        """Warn, once per job per check, about due runs no driver here can take."""
        wait_s = max(self.interval_s, UNREGISTERED_CHECK_S)

        async def look() -> float:
            await self.look_for_unregistered(database)
            return wait_s

        def failed(error: Exception) -> float:
            log.debug("reading due runs per job on %s failed: %s", database.label, error)
            return wait_s

        await self._repeat(database, look, failed)

    async def look_for_unregistered(self, database: _Database) -> None:
        database.unregistered_checked_at = self.clock.monotonic()
        due = await database.store.due_by_job(format_instant(self.clock.now()))
        for (module_id, job), count in sorted(due.items()):
            if (module_id, job) not in self.registry:
                _warn_unregistered(database, module_id, job, count)

    async def _schedule(self, database: _Database) -> None:
        """Start each due slot's run, then sleep until the next slot."""
        schedules = self.registry.schedules()

        async def start() -> float:
            async with self.open_stores.use(database.engine):
                started = await start_scheduled_runs(
                    database.store, self.registry, clock=self.clock
                )
            if started:
                database.wake_all()
            now = self.clock.now()
            upcoming = min(schedule.next_slot(now) for schedule in schedules)
            return min(MAX_SCHEDULE_SLEEP_S, (upcoming - now).total_seconds())

        message = "starting the scheduled runs of %s failed: %s; trying again in %.1f s"
        await self._repeat(
            database, start, _warning(database, message, self.interval_s, self.interval_s)
        )

    async def _forget_schedules(self, database: _Database) -> None:
        """No schedules here: forget, once, those that this registry's jobs had (a
        registry that schedules nothing starts nothing, so once at start suffices)."""
        try:
            async with self.open_stores.use(database.engine):
                await start_scheduled_runs(database.store, self.registry, clock=self.clock)
        except Exception as error:
            _warning(database, "forgetting the removed schedules of %s failed: %s", 0.0)(error)

    async def _prune(self, database: _Database) -> None:
        async def prune() -> float:
            async with self.open_stores.use(database.engine):
                deleted = await self._prune_once(database)
            if deleted:
                log.info(
                    "pruned %d finished runs of %s",
                    deleted,
                    database.label,
                    extra={"database": database.label, "deleted": deleted},
                )
            return PRUNE_INTERVAL_S

        message = "pruning %s failed: %s"
        await self._repeat(database, prune, _warning(database, message, PRUNE_INTERVAL_S))

    async def _prune_once(self, database: _Database) -> int:
        return await prune_by_retention(
            database.store,
            self.registry,
            prune_after=self.prune_after,
            prune_unregistered_after=self.prune_unregistered_after,
            sources=SYSTEM_SOURCES,
        )


def _checked_cap(max_databases: int | None) -> int | None:
    return None if max_databases is None else checked_count(max_databases, "max_databases")


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
    worker = _Worker(
        [],
        registry,
        chosen,
        interval_s=checked_seconds(interval_s, "interval_s"),
        concurrency=checked_count(concurrency, "concurrency"),
        on_health=on_health,
        stop=stop if stop is not None else asyncio.Event(),
        clock=resolve_clock(chosen.clock),
        prune_after=prune_after,
        prune_unregistered_after=prune_unregistered_after,
        max_open_sqlite=checked_count(max_open_sqlite, "max_open_sqlite"),
        max_databases=max_databases and checked_count(max_databases, "max_databases"),
        heartbeat_s=checked_seconds(heartbeat_s, "heartbeat_s"),
    )
    keep = checked_count(max_connections_per_database, "max_connections_per_database")
    await _serve_all(worker, databases, schema, keep, reloads)


def _check_what_to_drive(databases: Sequence[Database], registry: JobRegistry) -> None:
    if not databases:
        raise refuse("databases", "must name at least one database: run_worker needs one")
    if not isinstance(registry, JobRegistry):
        raise refuse_type("registry", f"must be a JobRegistry, got {type(registry).__name__}")


async def _serve_all(
    worker: _Worker,
    databases: Sequence[Database],
    schema: str | None,
    keep: int,
    reloads: asyncio.Queue[Sequence[Database]] | None,
) -> None:
    async with contextlib.AsyncExitStack() as owned:

        def make(database: Database) -> _Database:
            store = _store_of(database, schema, owned, keep)
            return _Database(store, worker.clock, owned=isinstance(database, str))

        worker.make_database = make
        worker.schema = schema
        worker.databases.extend(make(database) for database in databases)
        if reloads is None:
            for state in worker.databases:
                # The schema check (and a first connection) before any driver starts.
                await first_read(state, worker.clock, worker.stop, worker.interval_s)
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
    labels = [state.label for state in worker.databases]
    began = worker.clock.monotonic()
    shown = ", ".join(labels) if len(labels) <= 5 else f"{len(labels)} databases"
    log.info(
        "worker started on %s (%d jobs, concurrency %d, interval %.1f s, event loop: %s)",
        shown,
        len(worker.registry),
        worker.concurrency,
        worker.interval_s,
        _loop_name(),
        extra={"databases": labels},
    )
    try:
        await worker.run(reloads)
    finally:
        log.info(
            "worker stopped after %.1f s",
            worker.clock.monotonic() - began,
            extra={"databases": labels},
        )
