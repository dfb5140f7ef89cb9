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
from jobrun._core.sources import Sources


async def start_scheduled_runs(
    store: ScheduleStore,
    registry: JobRegistry,
    *,
    now: datetime | None = None,
    clock: ClockLike | None = None,
    sources: Sources,
) -> list[JobRun]:
    """:func:`jobrun.start_scheduled_runs`, handed its sources (the id minter, the system clock)."""
    schedules = registry.schedules()
    if not schedules:
        return []
    moment = sources.clock_for(clock).now() if now is None else now
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
            run = await _start_slot(store, schedule, slot, at, sources.mint_id())
            if run is not None:
                started.append(run)
    return started


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
    taken = ScheduleRow(*schedule.key, last_slot_at=slot_at, last_run_id=row.id, updated_at=at)
    result = await store.start_slot(taken, row)
    return None if result is None else job_run_of(result[0])
