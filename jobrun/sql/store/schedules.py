"""The schedules facet of the SQL store: each schedule's progress (``ScheduleStore``;
statements in :mod:`jobrun.sql.statements.schedules`).

A slot is taken by one conditional write on the schedule's row, and its run is
started in the same transaction (as the runs facet starts one,
:func:`jobrun.sql.store.runs.start_in`): a crash between them loses both or neither.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from jobrun._core import RunRow, ScheduleRow
from jobrun.sql.statements.schedules import (
    SCHEDULE_COLUMNS,
    add_schedule_statement,
    point_slot_statement,
    remove_schedule_statement,
    reset_schedule_statement,
    schedule_rows_statement,
    take_slot_statement,
)
from jobrun.sql.store.base import SqlStoreBase, kept_changing, prefixed_values
from jobrun.sql.store.runs import start_in, start_values


def _slot_values(schedule: ScheduleRow) -> dict[str, Any]:
    """The key of ``schedule``'s row, named as ``statements.schedules._slot_key`` reads it."""
    return {
        "slot_module_id": schedule.module_id,
        "slot_job": schedule.job,
        "slot_schedule": schedule.schedule,
    }


class SqlSchedules(SqlStoreBase):
    """The schedules' rows: read, added, reset to a new cron, removed, and a slot taken
    with its run started."""

    async def schedule_rows(self) -> builtins.list[ScheduleRow]:
        statement = self._shapes.of(schedule_rows_statement)
        async with self._operation("schedule_rows"):
            rows = await self._executor.fetch("schedule_rows", statement, {})
        return [ScheduleRow(*row) for row in rows]

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        if not rows:
            return
        statement = self._shapes.of(add_schedule_statement, self._is_postgres)
        async with (
            self._operation("add_schedules"),
            self._executor.transaction("add_schedules") as transaction,
        ):
            for row in rows:
                await transaction.fetch(statement, prefixed_values("row_", row, SCHEDULE_COLUMNS))

    async def reset_schedule(self, schedule: ScheduleRow, stored_cron: str | None) -> bool:
        values = _slot_values(schedule) | {
            "new_last_slot_at": schedule.last_slot_at,
            "new_last_run_id": schedule.last_run_id,
            "new_updated_at": schedule.updated_at,
            "new_cron": schedule.cron,
            "old_cron": stored_cron,
        }
        statement = self._shapes.of(reset_schedule_statement)
        return await self._lone_write("reset_schedule", statement, values)

    async def remove_schedules(self, keys: Sequence[tuple[str, str, str]]) -> None:
        if not keys:
            return
        statement = self._shapes.of(remove_schedule_statement)
        async with (
            self._operation("remove_schedules"),
            self._executor.transaction("remove_schedules") as transaction,
        ):
            for module_id, job, schedule in keys:
                values = {"slot_module_id": module_id, "slot_job": job, "slot_schedule": schedule}
                await transaction.fetch(statement, values)

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        slot = _slot_values(schedule) | {
            "slot_cron": schedule.cron,
            "new_last_slot_at": schedule.last_slot_at,
            "new_last_run_id": row.id,
            "new_updated_at": schedule.updated_at,
        }
        values = start_values(row, self._schema)
        async with (
            self._operation("start_slot"),
            self._executor.transaction("start_slot") as transaction,
        ):
            if not await transaction.fetch(self._shapes.of(take_slot_statement), slot):
                return None
            # The run is inserted in the same transaction as the slot is taken: a
            # crash between them loses both or neither.
            started = await start_in(transaction.fetch, self._statements, row, values)
            if started is not None and not started[1]:
                slot["new_last_run_id"] = started[0].id
                await transaction.fetch(self._shapes.of(point_slot_statement), slot)
        if started is None:
            raise kept_changing("start_slot")
        return started
