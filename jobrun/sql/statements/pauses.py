"""The statements of pause and unpause (revision 0009, :mod:`jobrun._core.operator.pausing`).

A run's own pause and unpause are operator changes (``statements.change_statement``);
here are those of a job's runs, the job's and the limit key's records, the wake-up
of runs deferred by a paused limit, and what starts and takes read of them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Text,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal_column,
    select,
    update,
)

from jobrun._core import PARKED_AT
from jobrun.sql.schema import job_pauses, job_runs, limit_pauses
from jobrun.sql.statements.compiled import dialect_insert
from jobrun.sql.statements.rules import is_live, is_paused, parked

_PARKED = literal_column(f"'{PARKED_AT}'", Text)


def _of_job() -> Any:
    runs = job_runs.c
    return and_(runs.module_id == bindparam("module_id"), runs.job == bindparam("job"))


def pause_job_statement(is_postgres: bool) -> Any:
    """Record job ``module_id``, ``job`` as paused at ``paused_at`` for ``reason``,
    unless it already is (the record is kept as it is)."""
    insert = dialect_insert(is_postgres, job_pauses).values(
        module_id=bindparam("module_id", type_=Text),
        job=bindparam("job", type_=Text),
        paused_at=bindparam("paused_at", type_=Text),
        reason=bindparam("reason", type_=Text),
    )
    return insert.on_conflict_do_nothing(index_elements=list(job_pauses.primary_key.columns))


def pause_job_runs_statement() -> Any:
    """Pause the job's live runs that are not paused yet (``pause_transition`` applied
    to each: those no lease holds wait at ``PARKED_AT``); their ids."""
    runs = job_runs.c
    at = bindparam("paused_at", type_=Text)
    return (
        update(job_runs)
        .where(_of_job(), is_live(), runs.paused_at.is_(None))
        .values(
            paused_at=at,
            pause_reason=bindparam("reason", type_=Text),
            updated_at=at,
            next_attempt_at=parked(runs.status, at, runs.lease_owner, runs.next_attempt_at),
        )
        .returning(runs.id)
    )


def unpause_job_statement() -> Any:
    """Delete job ``module_id``, ``job``'s pause record."""
    pauses = job_pauses.c
    return delete(job_pauses).where(
        pauses.module_id == bindparam("module_id"), pauses.job == bindparam("job")
    )


def unpause_job_runs_statement() -> Any:
    """Unpause the job's paused runs (``unpause_transition`` applied to each: due at
    once unless a lease holds them); their ids."""
    runs = job_runs.c
    return (
        update(job_runs)
        .where(_of_job(), is_paused())
        .values(
            paused_at=None,
            pause_reason=None,
            updated_at=bindparam("unpaused_at", type_=Text),
            next_attempt_at=func.nullif(runs.next_attempt_at, _PARKED),
        )
        .returning(runs.id)
    )


def pause_limit_statement(is_postgres: bool) -> Any:
    """Record limit key ``limit_key`` as paused (kept as it is when it already was);
    returns a row when it was not."""
    insert = dialect_insert(is_postgres, limit_pauses).values(
        limit_key=bindparam("limit_key", type_=Text),
        paused_at=bindparam("paused_at", type_=Text),
        reason=bindparam("reason", type_=Text),
    )
    return insert.on_conflict_do_nothing(index_elements=[limit_pauses.c.limit_key]).returning(
        limit_pauses.c.limit_key
    )


def unpause_limit_statement() -> Any:
    """Delete limit key ``limit_key``'s pause record."""
    return delete(limit_pauses).where(limit_pauses.c.limit_key == bindparam("limit_key"))


def unpark_statement(one_run: bool) -> Any:
    """Make due at once the runs waiting at ``PARKED_AT`` for the paused limit whose
    ``deferred_reason`` is ``reason`` (no lease, no pause of their own); with
    ``one_run``, only run ``run_id``. Their ids."""
    runs = job_runs.c
    condition = [
        is_live(),
        runs.lease_owner.is_(None),
        runs.paused_at.is_(None),
        runs.next_attempt_at == _PARKED,
        runs.deferred_reason == bindparam("reason", type_=Text),
    ]
    if one_run:
        condition.append(runs.id == bindparam("run_id", type_=Text))
    return update(job_runs).where(*condition).values(next_attempt_at=None).returning(runs.id)


def limit_is_paused(key: Any) -> Any:
    """Whether limit key ``key`` (an expression) is paused: a primary-key look-up."""
    return exists(select(limit_pauses.c.limit_key).where(limit_pauses.c.limit_key == key))


def limit_paused_statement() -> Any:
    """Whether limit key ``limit_key`` is paused."""
    return select(limit_is_paused(bindparam("limit_key", type_=Text)))


def job_pauses_statement() -> Any:
    """Every paused job: module id, job, paused at, reason."""
    pauses = job_pauses.c
    return select(pauses.module_id, pauses.job, pauses.paused_at, pauses.reason).order_by(
        pauses.module_id, pauses.job
    )


def limit_pauses_statement() -> Any:
    """Every paused limit key: key, paused at, reason."""
    pauses = limit_pauses.c
    return select(pauses.limit_key, pauses.paused_at, pauses.reason).order_by(pauses.limit_key)


def started_paused(values: dict[str, Any]) -> dict[str, Any]:
    """The pause columns of a run inserted with ``values`` (column: expression): paused
    since its start, for its job's reason, and waiting at ``PARKED_AT``, while its
    job has a pause record; as given otherwise. Read in the insert's own statement."""
    pauses = job_pauses.c
    of_job = and_(pauses.module_id == values["module_id"], pauses.job == values["job"])
    reason = select(pauses.reason).where(of_job).scalar_subquery()
    job_paused = exists(select(pauses.module_id).where(of_job))
    paused_at = case((job_paused, values["started_at"]), else_=values["paused_at"])
    return {
        "paused_at": paused_at,
        "pause_reason": func.coalesce(values["pause_reason"], reason),
        "next_attempt_at": parked(
            values["status"], paused_at, values["lease_owner"], values["next_attempt_at"]
        ),
    }


def job_pause_of(module_id: Any, job: Any) -> tuple[Any, Any]:
    """The pause record of job ``module_id``, ``job`` (expressions) to outer-join a
    batch of starts to: the table's alias, and the join's condition."""
    pauses = job_pauses.alias("job_pause")
    return pauses, and_(pauses.c.module_id == module_id, pauses.c.job == job)


def started_paused_by(values: dict[str, Any], pause: tuple[Any, Any]) -> dict[str, Any]:
    """:func:`started_paused`, with the job's pause record read by the outer join
    :func:`job_pause_of` made (one look-up per run, not one per column)."""
    record = pause[0].c
    job_paused = record.module_id.is_not(None)
    paused_at = case((job_paused, values["started_at"]), else_=values["paused_at"])
    return {
        "paused_at": paused_at,
        "pause_reason": func.coalesce(values["pause_reason"], record.reason),
        "next_attempt_at": parked(
            values["status"], paused_at, values["lease_owner"], values["next_attempt_at"]
        ),
    }
