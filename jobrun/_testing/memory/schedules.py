"""The schedules facet of the memory store: each schedule's progress."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import replace

from jobrun._core import RunRow, ScheduleRow
from jobrun._testing.memory.base import MemoryStoreBase
from jobrun._testing.memory.runs import start_in


class MemorySchedules(MemoryStoreBase):
    """The schedules' rows, and a slot taken with its run started."""

    schedules: dict[tuple[str, str, str], ScheduleRow]

    async def schedule_rows(self) -> builtins.list[ScheduleRow]:
        return [self.schedules[key] for key in sorted(self.schedules)]

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        for row in rows:
            self.schedules.setdefault((row.module_id, row.job, row.schedule), row)

    async def reset_schedule(self, schedule: ScheduleRow, stored_cron: str | None) -> bool:
        key = (schedule.module_id, schedule.job, schedule.schedule)
        stored = self.schedules.get(key)
        if stored is None or stored.cron != stored_cron:
            return False
        self.schedules[key] = schedule
        return True

    async def remove_schedules(self, keys: Sequence[tuple[str, str, str]]) -> None:
        for key in keys:
            self.schedules.pop(key, None)

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        key = (schedule.module_id, schedule.job, schedule.schedule)
        stored = self.schedules.get(key)
        if (
            stored is None
            or stored.cron != schedule.cron
            or not stored.last_slot_at < schedule.last_slot_at
        ):
            return None
        run, inserted = start_in(self.runs, row, self.job_pauses)
        self.schedules[key] = replace(schedule, last_run_id=run.id)
        return run, inserted
