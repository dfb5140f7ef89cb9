"""Starting the runs of due schedule slots, each slot once across every caller.

A schedule's stored row counts the slots of one cron (the one stored with it).
A schedule seen for the first time, or whose cron is not the stored one (changed,
or a row from before revision 0005), starts from "now": its next slot is the
first started, so slots of an older cron are never replayed. A schedule removed
from a registry loses its row when that registry registers its job.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from jobrun._core.engine.registry import JobRegistry
from jobrun._core.model.formats import format_instant, parse_instant
from jobrun._core.model.queue_safety import encode_queue_safe
from jobrun._core.model.records import JobRun, ScheduleRow
from jobrun._core.model.run_views import job_run_of
from jobrun._core.operator.runs import new_run_row
from jobrun._core.port import ScheduleStore
from jobrun._core.rules.schedules import Schedule
from jobrun._core.sources import Sources
from jobrun._core.time.clock import ClockLike

ScheduleKey = tuple[str, str, str]


async def start_scheduled_runs(
    sources: Sources,
    /,
    store: ScheduleStore,
    registry: JobRegistry,
    *,
    now: datetime | None = None,
    clock: ClockLike | None = None,
) -> list[JobRun]:
    """Start the run of every due slot of ``registry``'s schedules; returns those runs.

    Call it from the host's own loop (``jobrun worker`` and :func:`jobrun.run_worker`
    call it at each slot). Any number of callers on any number of hosts may call
    it at once: each slot is started by one of them, once, and never again,
    whether or not its run has ended since. A schedule seen for the first time,
    or whose cron changed, starts with its next slot (no slot of an older cron is
    replayed). The stored state of schedules that ``registry`` no longer declares
    for the jobs it registers is deleted (other jobs' schedules are left alone).
    Costs one read when nothing is due, and one short transaction per slot
    started. ``now`` (default: the clock's) is the instant slots are due by.
    """
    schedules = registry.schedules()
    if not schedules and not len(registry):
        return []
    moment = sources.clock_for(clock).now() if now is None else now
    at = format_instant(moment)
    stored = {(row.module_id, row.job, row.schedule): row for row in await store.schedule_rows()}
    await _forget_removed(store, registry, stored)
    current = await _settle(store, schedules, stored, at)
    started: list[JobRun] = []
    for schedule in schedules:
        row = current.get(schedule.key)
        if row is None:
            continue
        for slot in schedule.slots_to_start(parse_instant(row.last_slot_at), moment):
            run = await _start_slot(store, schedule, slot, at, sources.mint_id())
            if run is not None:
                started.append(run)
    return started


def removed_schedules(
    registry: JobRegistry, stored: Mapping[ScheduleKey, ScheduleRow]
) -> list[ScheduleKey]:
    """The stored schedules of jobs ``registry`` registers that it no longer declares.

    A job's schedules belong to the registries that register the job; rows of jobs
    this registry does not register are another application's, and are left alone.
    """
    declared = {schedule.key for schedule in registry.schedules()}
    return sorted(key for key in stored if (key[0], key[1]) in registry and key not in declared)


async def _forget_removed(
    store: ScheduleStore, registry: JobRegistry, stored: dict[ScheduleKey, ScheduleRow]
) -> None:
    removed = removed_schedules(registry, stored)
    if removed:
        await store.remove_schedules(removed)
        for key in removed:
            del stored[key]


async def _settle(
    store: ScheduleStore,
    schedules: list[Schedule],
    stored: Mapping[ScheduleKey, ScheduleRow],
    at: str,
) -> dict[ScheduleKey, ScheduleRow]:
    """The rows whose slots may be started now: those that count their schedule's cron.

    A schedule without a row gets one; one whose row counts another cron's slots
    has it reset (one caller wins; the others find the cron already theirs). Either
    way nothing before now was missed under this cron: its next slot is the first.
    """
    unseen = [schedule for schedule in schedules if schedule.key not in stored]
    if unseen:
        await store.add_schedules(
            [ScheduleRow(*schedule.key, at, None, at, schedule.cron) for schedule in unseen]
        )
    current: dict[ScheduleKey, ScheduleRow] = {}
    for schedule in schedules:
        row = stored.get(schedule.key)
        if row is None:
            continue
        if row.cron == schedule.cron:
            current[schedule.key] = row
            continue
        # Never behind the stored slot: a host whose clock lags cannot reopen a slot
        # that a host whose clock leads has taken. No last run: last_slot_at is no
        # run's slot now (``jobrun schedules`` shows a slot only with its run).
        since = max(row.last_slot_at, at)
        reset = ScheduleRow(*schedule.key, since, None, at, schedule.cron)
        await store.reset_schedule(reset, row.cron)
    return current


async def _start_slot(
    store: ScheduleStore, schedule: Schedule, slot: datetime, at: str, run_id: str
) -> JobRun | None:
    slot_at = format_instant(slot)
    row = new_run_row(
        run_id=run_id,
        module_id=schedule.module_id,
        job=schedule.job,
        instance=schedule.instance if schedule.instance is not None else slot_at,
        payload_text=encode_queue_safe(schedule.payload, "payload", store.limits.max_payload_bytes),
        priority=schedule.priority,
        at=at,
    )
    taken = ScheduleRow(*schedule.key, slot_at, row.id, at, schedule.cron)
    result = await store.start_slot(taken, row)
    return None if result is None else job_run_of(result[0])
