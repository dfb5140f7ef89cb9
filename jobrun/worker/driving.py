"""A served database's drivers: drive its due runs, and wait well when there are none.

Per database, ``concurrency`` drivers call the drive of :func:`jobrun.run_due_jobs`
in a loop; one semaphore (the worker's ``slots``) keeps at most ``concurrency`` of
those calls in flight across all databases. Leases make several drivers on one
database safe.

When a database has nothing due, one of its drivers polls (one claim query)
after a delay that doubles from 50 ms up to ``interval_s``, while the others
wait to be woken. A database that can be woken (inotify, LISTEN) is instead
probed for its next due instant when woken, and driven only when something is
due or a holder is proven dead (:mod:`jobrun.worker.deaths`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from dataclasses import replace
from typing import Any

from jobrun._api import SYSTEM_SOURCES
from jobrun._core import (
    ClaimTurns,
    DriveOptions,
    PassObserver,
    RunKey,
    boot_instant,
    drive_due_jobs,
    lease_instants,
    parse_instant,
)
from jobrun._core import proof_of_death as orphans
from jobrun.errors import describe_exception
from jobrun.sql.next_due import (
    BUSY_LOOK_AGAIN_S,
    FileBusy,
    postgres_next_due_at,
    sqlite_next_due,
)
from jobrun.worker.database import FIRST_IDLE_DELAY_S, ServedDatabase
from jobrun.worker.deaths import dead_holder_seen, jobs_of
from jobrun.worker.listen import listens
from jobrun.worker.rounds import repeat
from jobrun.worker.settings import FAILED_DRIVE_RETRY_S, UNREGISTERED_CHECK_S, WorkerSettings
from jobrun.worker.upkeep import Upkeep
from jobrun.worker.wakeups import SWEEP_S, OpenStores

log = logging.getLogger("jobrun.worker")


class Drivers:
    """The drivers of every served database (see the module's docstring)."""

    def __init__(
        self,
        settings: WorkerSettings,
        open_stores: OpenStores,
        wakeups: collections.Counter[str],
        upkeep: Upkeep,
    ) -> None:
        self.settings = settings
        self.open_stores = open_stores
        self.wakeups = wakeups
        self.upkeep = upkeep
        self.slots = asyncio.Semaphore(settings.concurrency)

    async def drive(self, database: ServedDatabase, observer: PassObserver, number: int) -> None:
        settings = self.settings
        name = settings.driver_name
        driver = f"{name}/{number}" if settings.concurrency > 1 else name
        # Made once per driver: its name, the observer that wakes its siblings, the clock.
        options = replace(
            settings.options, driver_name=driver, observer=observer, clock=settings.clock
        )
        # Its own count of claims, kept across rounds: one in FAIR_EVERY goes by age.
        turns = ClaimTurns()
        await repeat(
            settings.clock,
            database,
            functools.partial(self._drive_round, database, options, turns),
            functools.partial(self._drive_failed, database),
        )

    async def _drive_round(
        self, database: ServedDatabase, options: DriveOptions, turns: ClaimTurns
    ) -> float | None:
        """One drive of the due runs, then, if it found none, a wait for more. A
        woken database is driven only when its probe finds something due."""
        database.pending = False
        # Writes this process still owes (a release the store refused) go first:
        # the probe cannot see them, and the next drive sends them again.
        owing = len(database.store.owed_releases) > 0
        if database.awaiting_listen and not owing:
            # (A LISTEN that takes longer than the interval: drive without it.)
            if not await database.idle(self.settings.interval_s):
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
        self, database: ServedDatabase, options: DriveOptions, turns: ClaimTurns
    ) -> Any:
        if database.lazy and not database.schedules_forgotten:
            database.schedules_forgotten = True
            await self.upkeep.forget_schedules(database)
        report = await drive_due_jobs(
            database.store,
            self.settings.registry,
            options,
            SYSTEM_SOURCES,
            stop=database.stop,
            on_user_exit=functools.partial(_log_user_exit, database),
            turns=turns,
        )
        checked_at = database.unregistered_checked_at
        looked_lately = (
            checked_at is not None
            and self.settings.clock.monotonic() - checked_at < UNREGISTERED_CHECK_S
        )
        if database.lazy and not report.attempted and not looked_lately:
            await self.upkeep.look_for_unregistered(database)
        return report

    async def _due_now(self, database: ServedDatabase) -> bool:
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
        now_s = self.settings.clock.monotonic()
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
        self, database: ServedDatabase, due_at_s: float | None, sweep_at_s: float
    ) -> tuple[float, bool] | None:
        """``None``: a holder of a live run is proven dead, drive now; else how long
        to wait (until the due instant ``due_at_s``, the sweep at ``sweep_at_s``, both
        monotonic, or the next look) and whether that is the next look's wait. See
        jobrun.worker.deaths."""
        jobs, owed = jobs_of(self.settings.registry), False
        if due_at_s is not None:
            # Live runs, none due: one may be leased by a holder that died (a leased
            # run is due only at its expiry).
            host, on_presence = SYSTEM_SOURCES.host, listens(database.engine)
            clock = self.settings.clock
            dead, owed = await dead_holder_seen(database, jobs, clock, host, listens=on_presence)
            if dead:
                return None
        now_s = self.settings.clock.monotonic()
        timeout_s = (sweep_at_s if due_at_s is None else min(due_at_s, sweep_at_s)) - now_s
        look_s = orphans.look_again_in_s(database.store, jobs, now_s, owed=owed)
        if look_s is not None and look_s < timeout_s:
            return look_s, True
        return max(0.0, timeout_s), False

    async def _due_in_s(self, database: ServedDatabase) -> float | None:
        """Seconds until the database's next run comes due (``None``: no live run)."""
        # Judged as the claim judges it: after a wall-clock step a live lease must not
        # look due here while the claim (rightly) passes it over, in a loop.
        now, _ = lease_instants(self.settings.clock)
        boot = boot_instant(self.settings.clock)
        held_in_s = None
        if database.path is not None:
            try:
                due_at, held_ms = sqlite_next_due(database.path, boot)
            except FileBusy:
                # Busy for a moment (a checkpoint, a recovery): read again shortly,
                # rather than drive it (a drive opens the file, and its writes wake
                # this driver again).
                return BUSY_LOOK_AGAIN_S
            if held_ms is not None and boot is not None:
                # A lease of this boot: due when its boot-clock expiry comes.
                held_in_s = (held_ms - boot.ms) / 1000
        else:
            due_at = await postgres_next_due_at(database.store)
        due_in_s = None if due_at is None else (parse_instant(due_at) - now).total_seconds()
        if due_in_s is None or held_in_s is None:
            return held_in_s if due_in_s is None else due_in_s
        return min(due_in_s, held_in_s)

    async def _wait_for_work(self, database: ServedDatabase) -> None:
        if database.polling:
            # Another driver polls this database: wait until something wakes us.
            await database.idle(None)
            return
        database.polling = True
        try:
            delay = database.delay_s
            database.delay_s = min(self.settings.interval_s, delay * 2)
            # Another process's holder may die: the next drive's claim scans again
            # (once its last scan is SCAN_INTERVAL_S old) and takes over in time.
            now_s = self.settings.clock.monotonic()
            jobs = jobs_of(self.settings.registry)
            look_s = orphans.look_again_in_s(
                database.store, jobs, now_s, every_s=orphans.SCAN_INTERVAL_S
            )
            await database.idle(delay if look_s is None else min(delay, look_s))
        finally:
            database.polling = False

    def _drive_failed(self, database: ServedDatabase, error: BaseException) -> float:
        """Log a failed drive; the seconds to wait before the next.

        The next try comes soon (the store may answer again any moment, and the
        runs whose release it failed wait for it: see ``jobrun._core.leases.owed_releases``); the
        warning comes when a streak of failures begins and once per interval after.
        """
        now = self.settings.clock.monotonic()
        retry_s = min(self.settings.interval_s, FAILED_DRIVE_RETRY_S)
        if database.failing_since is None or now - database.warned_at >= self.settings.interval_s:
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


def _log_user_exit(
    database: ServedDatabase, run: RunKey, raised: KeyboardInterrupt | SystemExit
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
