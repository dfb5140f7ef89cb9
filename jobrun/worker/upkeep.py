"""A served database's upkeep, beside its drivers: health, schedules, retention, strays.

Per database, one task starts the runs of due schedule slots (see
:meth:`jobrun.JobRegistry.schedule`): it sleeps until the next slot, calls
:func:`jobrun.start_scheduled_runs` and wakes the drivers. Another, with
``prune_after`` or a job's ``keep_for``, deletes expired finished runs of the
registered jobs (of the others only with ``prune_unregistered_after``) every
``PRUNE_INTERVAL_S``, in small transactions, away from the drivers. Others read
the database's health for ``on_health`` and warn of due runs of jobs this worker
does not register.
"""

from __future__ import annotations

import logging

from jobrun._api import SYSTEM_SOURCES, job_run_health, start_scheduled_runs
from jobrun._core import format_instant, prune_by_retention
from jobrun.worker.database import ServedDatabase
from jobrun.worker.rounds import repeat, warning
from jobrun.worker.settings import (
    MAX_SCHEDULE_SLEEP_S,
    PRUNE_INTERVAL_S,
    UNREGISTERED_CHECK_S,
    HealthCallback,
    WorkerSettings,
)
from jobrun.worker.wakeups import OpenStores

log = logging.getLogger("jobrun.worker")


class Upkeep:
    """The tasks of a served database besides its drivers (see the module's docstring)."""

    def __init__(self, settings: WorkerSettings, open_stores: OpenStores) -> None:
        self.settings = settings
        self.open_stores = open_stores

    async def health(self, database: ServedDatabase, record: HealthCallback) -> None:
        interval_s = self.settings.interval_s

        async def read() -> float:
            async with self.open_stores.use(database.engine):
                record(database.label, await job_run_health(database.store))
            return interval_s

        failed = warning(database, "reading the health of %s failed: %s", interval_s)
        await repeat(self.settings.clock, database, read, failed)

    async def watch_unregistered(self, database: ServedDatabase) -> None:
        """Warn, once per job per check, about due runs no driver here can take."""
        wait_s = max(self.settings.interval_s, UNREGISTERED_CHECK_S)

        async def look() -> float:
            await self.look_for_unregistered(database)
            return wait_s

        def failed(error: Exception) -> float:
            log.debug("reading due runs per job on %s failed: %s", database.label, error)
            return wait_s

        await repeat(self.settings.clock, database, look, failed)

    async def look_for_unregistered(self, database: ServedDatabase) -> None:
        clock, registry = self.settings.clock, self.settings.registry
        database.unregistered_checked_at = clock.monotonic()
        due = await database.store.due_by_job(format_instant(clock.now()))
        for (module_id, job), count in sorted(due.items()):
            if (module_id, job) not in registry:
                _warn_unregistered(database, module_id, job, count)

    async def schedule(self, database: ServedDatabase) -> None:
        """Start each due slot's run, then sleep until the next slot."""
        clock, registry = self.settings.clock, self.settings.registry
        schedules = registry.schedules()

        async def start() -> float:
            async with self.open_stores.use(database.engine):
                started = await start_scheduled_runs(database.store, registry, clock=clock)
            if started:
                database.wake_all()
            now = clock.now()
            upcoming = min(schedule.next_slot(now) for schedule in schedules)
            return min(MAX_SCHEDULE_SLEEP_S, (upcoming - now).total_seconds())

        interval_s = self.settings.interval_s
        message = "starting the scheduled runs of %s failed: %s; trying again in %.1f s"
        await repeat(clock, database, start, warning(database, message, interval_s, interval_s))

    async def forget_schedules(self, database: ServedDatabase) -> None:
        """No schedules here: forget, once, those that this registry's jobs had (a
        registry that schedules nothing starts nothing, so once at start suffices)."""
        try:
            async with self.open_stores.use(database.engine):
                await start_scheduled_runs(
                    database.store, self.settings.registry, clock=self.settings.clock
                )
        except Exception as error:
            warning(database, "forgetting the removed schedules of %s failed: %s", 0.0)(error)

    async def prune(self, database: ServedDatabase) -> None:
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
        failed = warning(database, message, PRUNE_INTERVAL_S)
        await repeat(self.settings.clock, database, prune, failed)

    async def _prune_once(self, database: ServedDatabase) -> int:
        return await prune_by_retention(
            database.store,
            self.settings.registry,
            prune_after=self.settings.prune_after,
            prune_unregistered_after=self.settings.prune_unregistered_after,
            sources=SYSTEM_SOURCES,
        )


def _warn_unregistered(database: ServedDatabase, module_id: str, job: str, count: int) -> None:
    log.warning(
        "%d due run(s) of job %r of module %r on %s wait for a driver: this "
        "worker does not register that job (register it, or cancel the runs)",
        count,
        job,
        module_id,
        database.label,
        extra={"database": database.label, "module_id": module_id, "job": job},
    )
