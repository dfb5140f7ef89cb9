"""What the worker sends beside the port: when a database's next run is due, and the
lock that says a worker serves a database.

Read by :mod:`jobrun.sql.next_due` (an idle worker's timer) and
:mod:`jobrun.worker.database_leases` (one worker per database on Postgres).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, bindparam, case, func, literal_column, not_, null, select

from jobrun._core import PARKED_AT
from jobrun.sql.schema import job_runs
from jobrun.sql.statements.rules import boot_held, due_at, is_live, is_paused


def next_due_statement(booted: bool = False) -> Any:
    """The earliest due instant of the live runs (a lease's expiry among them: while
    a run is leased, its due instant is the lease's end): when an idle worker looks
    again (see ``jobrun.worker.wakeups``). ``booted`` (SQLite): a run held on the
    reader's boot clock (``boot_id``, ``boot_ms``) is left out of it, and the
    earliest such expiry is the second column."""
    # Paused runs never come due: those waiting at PARKED_AT are out of the range,
    # a paused one still leased (or stranded) is filtered on its row.
    parked_at = literal_column(f"'{PARKED_AT}'", Text)
    live = (is_live(), due_at() != parked_at, not_(is_paused()))
    if not booted:
        return select(func.min(due_at())).where(*live)
    held = boot_held()
    return select(
        func.min(case((held, null()), else_=due_at())),
        func.min(case((held, job_runs.c.lease_boot_expires_ms), else_=null())),
    ).where(*live)


def take_database_statement() -> Any:
    """Postgres: try the session advisory lock that says "a worker serves this database"
    (the two-key form, so it is never read as a presence key: those are one bigint)."""
    return select(func.pg_try_advisory_lock(bindparam("lease_class"), bindparam("lease_key")))


def release_database_statement() -> Any:
    """Postgres: let go of the lock of :func:`take_database_statement`."""
    return select(func.pg_advisory_unlock(bindparam("lease_class"), bindparam("lease_key")))
