"""The schedules facet's statements (``ScheduleStore``): each schedule's progress.

A slot is taken by one conditional write on the schedule's row
(:func:`take_slot_statement`), in the transaction that starts its run, so one
caller at most starts it, whatever the number of hosts.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, and_, bindparam, delete, select, update

from jobrun.sql.schema import job_schedules
from jobrun.sql.statements.compiled import dialect_insert

SCHEDULE_COLUMNS = tuple(column.name for column in job_schedules.c)


def schedule_rows_statement() -> Any:
    """Every schedule's row, in key order."""
    return select(job_schedules).order_by(*job_schedules.primary_key.columns)


def add_schedule_statement(is_postgres: bool) -> Any:
    """Insert the schedule row ``row_*`` unless its key has one already."""
    return (
        dialect_insert(is_postgres, job_schedules)
        .values({name: bindparam(f"row_{name}") for name in SCHEDULE_COLUMNS})
        .on_conflict_do_nothing(index_elements=list(job_schedules.primary_key.columns))
    )


def _slot_key() -> Any:
    slots = job_schedules.c
    return and_(
        slots.module_id == bindparam("slot_module_id"),
        slots.job == bindparam("slot_job"),
        slots.schedule == bindparam("slot_schedule"),
    )


def take_slot_statement() -> Any:
    """The conditional write that picks the one caller who starts a slot: the schedule
    ``slot_*`` moves to ``new_last_slot_at`` (with ``new_last_run_id``,
    ``new_updated_at``) only from an earlier slot of the same cron ``slot_cron``. On
    Postgres a second caller waits on the row, then finds the slot taken."""
    slots = job_schedules.c
    return (
        update(job_schedules)
        .where(
            _slot_key(),
            slots.cron == bindparam("slot_cron"),
            slots.last_slot_at < bindparam("new_last_slot_at"),
        )
        .values(
            last_slot_at=bindparam("new_last_slot_at"),
            last_run_id=bindparam("new_last_run_id"),
            updated_at=bindparam("new_updated_at"),
        )
        .returning(slots.module_id)
    )


def reset_schedule_statement() -> Any:
    """The schedule ``slot_*`` counts the slots of ``new_cron`` from ``new_last_slot_at``
    (with ``new_last_run_id``, ``new_updated_at``), only if its cron is still
    ``old_cron`` (NULL matching NULL): of callers who read the same row, one resets it."""
    slots = job_schedules.c
    return (
        update(job_schedules)
        .where(_slot_key(), slots.cron.is_not_distinct_from(bindparam("old_cron", type_=Text())))
        .values(
            last_slot_at=bindparam("new_last_slot_at"),
            last_run_id=bindparam("new_last_run_id"),
            updated_at=bindparam("new_updated_at"),
            cron=bindparam("new_cron"),
        )
        .returning(slots.module_id)
    )


def remove_schedule_statement() -> Any:
    """Delete the row of the schedule ``slot_*`` (none: nothing)."""
    return delete(job_schedules).where(_slot_key())


def point_slot_statement() -> Any:
    """Point the schedule ``slot_*`` at the live run ``new_last_run_id`` it joined."""
    return update(job_schedules).where(_slot_key()).values(last_run_id=bindparam("new_last_run_id"))
