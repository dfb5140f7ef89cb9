"""Starting the runs of due schedule slots, each slot once across every caller."""

from __future__ import annotations

from datetime import datetime

from jobrun._core.clock import ClockLike
from jobrun._core.formats import format_instant, parse_instant
from jobrun._core.port import ScheduleStore
from jobrun._core.queue_safety import encode_queue_safe
from jobrun._core.records import JobRun, ScheduleRow, job_run_of
from jobrun._core.registry import JobRegistry
from jobrun._core.runs import new_run_row
from jobrun._core.schedules import Schedule
from jobrun._system import resolve_clock


async def start_scheduled_runs(
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
    whether or not its run has ended since. A schedule seen for the first time
    starts with its next slot. Costs one read when nothing is due, and one short
    transaction per slot started. ``now`` (default: the clock's) is the instant
    slots are due by.
    """
    schedules = registry.schedules()
    if not schedules:
        return []
    moment = resolve_clock(clock).now() if now is None else now
    at = format_instant(moment)
    stored = {(row.module_id, row.job, row.schedule): row for row in await store.schedule_rows()}
    unseen = [schedule for schedule in schedules if schedule.key not in stored]
    if unseen:
        # First sight: nothing before now was missed; the next slot is the first.
        await store.add_schedules(
            [
                ScheduleRow(*schedule.key, last_slot_at=at, last_run_id=None, updated_at=at)
                for schedule in unseen
            ]
        )
    started: list[JobRun] = []
    for schedule in schedules:
        row = stored.get(schedule.key)
        if row is None:
            continue
        for slot in schedule.slots_to_start(parse_instant(row.last_slot_at), moment):
            run = await _start_slot(store, schedule, slot, at)
            if run is not None:
                started.append(run)
    return started


async def _start_slot(
    store: ScheduleStore, schedule: Schedule, slot: datetime, at: str
) -> JobRun | None:
    slot_at = format_instant(slot)
    row = new_run_row(
        module_id=schedule.module_id,
        job=schedule.job,
        instance=schedule.instance if schedule.instance is not None else slot_at,
        payload_text=encode_queue_safe(schedule.payload, "payload", store.limits.max_payload_bytes),
        priority=schedule.priority,
        at=at,
    )
    taken = ScheduleRow(*schedule.key, last_slot_at=slot_at, last_run_id=row.id, updated_at=at)
    result = await store.start_slot(taken, row)
    return None if result is None else job_run_of(result[0])
