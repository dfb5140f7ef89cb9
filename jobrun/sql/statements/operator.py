"""The operator facet's statements: changes by hand, health, pruning, retention, workers.

What the store sends for ``OperatorStore`` (its limit operations, cooling a limit
down and reading the limits' usage, are in :mod:`jobrun.sql.statements.limits`).
Health and the two per-job counts are compiled with the store
(:class:`OperatorStatements`), with the resume's refill; the others once per shape.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, bindparam, delete, func, literal, literal_column, not_, select, update

from jobrun._core import PARKED_AT, WorkerRow
from jobrun.sql.executor import Compiler
from jobrun.sql.schema import job_retention, job_runs, job_steps, job_workers
from jobrun.sql.statements.compiled import dialect_insert
from jobrun.sql.statements.rules import (
    FAILED,
    RUNNING,
    is_cancelled,
    is_due,
    is_leased,
    is_live,
    is_paused,
    is_prunable,
    parked,
    refill_on_resume,
    stored_version,
    waiting_since,
)


class OperatorStatements:
    """The operator facet's fixed statements, compiled for one dialect with the store."""

    def __init__(self, compile_: Compiler) -> None:
        self.refill = compile_(refill_on_resume())
        runs = job_runs.c
        now_at = bindparam("now_at", type_=Text)
        live = is_live()
        # Due includes the stranded: a lease that expired is due since its expiry.
        waiting = is_due(now_at)
        # The running range of the claim-order index (status leads it).
        self.due_by_job = compile_(
            select(runs.module_id, runs.job, func.count())
            .where(waiting)
            .group_by(runs.module_id, runs.job)
        )
        # The running range of the status index; a few rows per job (one per version).
        version = stored_version()
        self.versions_by_job = compile_(
            select(runs.module_id, runs.job, version, func.count())
            .where(live)
            .group_by(runs.module_id, runs.job, version)
        )
        # Finished runs are kept forever; every filter here leads with status so
        # the history is never scanned (done runs are not counted at all).
        self.health = compile_(
            select(
                func.count().filter(live),
                func.count().filter(waiting),
                func.count().filter(is_leased(now_at)),
                func.count().filter(runs.status == FAILED),
                func.min(waiting_since()).filter(waiting),
                func.count().filter(is_cancelled()),
                func.count().filter(is_paused()),
            ).where(runs.status.in_([literal(RUNNING), literal(FAILED)]))
        )


def change_statement(columns: tuple[str, ...], leased: bool, paused: bool | None = None) -> Any:
    """An operator's change (``jobrun._core.rules.transitions.RunChange``): ``new_{column}``
    on run ``run_id`` while its status is ``when_status`` (and, if ``leased``, it
    holds a lease; if ``paused`` is not ``None``, it is paused or not), with the due
    instant ``RunChange.applied`` gives: out of ``PARKED_AT`` unless written, and
    there for a paused run left without a lease."""
    runs = job_runs.c
    condition = [runs.id == bindparam("run_id"), runs.status == bindparam("when_status")]
    if leased:
        condition.append(runs.lease_owner.is_not(None))
    if paused is not None:
        condition.append(runs.paused_at.is_not(None) if paused else runs.paused_at.is_(None))
    values: dict[str, Any] = {
        name: bindparam(f"new_{name}", type_=runs[name].type) for name in columns
    }

    def after(name: str) -> Any:
        return values.get(name, runs[name])

    due = values.get("next_attempt_at")
    if due is None:
        due = func.nullif(runs.next_attempt_at, literal_column(f"'{PARKED_AT}'", Text))
    values["next_attempt_at"] = parked(
        after("status"), after("paused_at"), after("lease_owner"), due
    )
    # The job too: an unpause wakes the job's listening workers (SqlJobRunStore.pause).
    return (
        update(job_runs)
        .where(*condition)
        .values(values)
        .returning(runs.id, runs.module_id, runs.job)
    )


def prune_ledgers(ids: int) -> Any:
    """One prune batch's ledgers: the runs ``id_{i}`` just deleted."""
    id_params: list[Any] = [bindparam(f"id_{i}") for i in range(ids)]
    return delete(job_steps).where(job_steps.c.run_id.in_(id_params))


def prune_runs(statuses: int, only_jobs: int | None, except_jobs: int) -> Any:
    """One prune batch: delete at most ``batch_size`` runs in id order that
    :func:`is_prunable` selects. Each run is checked again as it is deleted (a run
    resumed since the batch was chosen stays); returns the ids deleted."""
    runs = job_runs.c
    doomed = (
        select(runs.id)
        .where(is_prunable(statuses, only_jobs, except_jobs))
        .order_by(runs.id)
        .limit(bindparam("batch_size", type_=runs.attempts.type))
    )
    return delete(job_runs).where(runs.id.in_(doomed), not_(is_live())).returning(runs.id)


# -- each job's own retention (jobrun._core.port.OperatorStore) ------------------------------


def record_retention_statement(is_postgres: bool) -> Any:
    """Record the retention ``keep_for_s`` of the job ``kept_module_id``, ``kept_job``
    (``updated_at``), replacing what was recorded."""
    inserted = dialect_insert(is_postgres, job_retention).values(
        module_id=bindparam("kept_module_id"),
        job=bindparam("kept_job"),
        keep_for_s=bindparam("keep_for_s"),
        updated_at=bindparam("updated_at"),
    )
    return inserted.on_conflict_do_update(
        index_elements=list(job_retention.primary_key.columns),
        set_={
            "keep_for_s": inserted.excluded.keep_for_s,
            "updated_at": inserted.excluded.updated_at,
        },
    )


def forget_retention_statement() -> Any:
    """Delete the recorded retention of the job ``kept_module_id``, ``kept_job``."""
    kept = job_retention.c
    return delete(job_retention).where(
        kept.module_id == bindparam("kept_module_id"), kept.job == bindparam("kept_job")
    )


def recorded_retention_statement() -> Any:
    """Every job's recorded retention: ``(module_id, job, keep_for_s)``."""
    kept = job_retention.c
    return select(kept.module_id, kept.job, kept.keep_for_s).order_by(kept.module_id, kept.job)


# -- the workers that said they are alive (jobrun._core.operator.worker_registry) ------------

WORKER_COLUMNS = tuple(column.name for column in job_workers.c)
# Rows come back in table order, which is WorkerRow's field order.
assert tuple(WorkerRow.__dataclass_fields__) == WORKER_COLUMNS


def worker_is_live(now_at: Any) -> Any:
    """Twin of :func:`jobrun._core.operator.worker_registry.worker_is_live`."""
    return job_workers.c.expires_at > now_at


def beat_worker_statement(is_postgres: bool) -> Any:
    """Write the worker row ``worker_*``: inserted at its first heartbeat (or again, if a
    sweep took it for gone), its heartbeat, expiry and jobs refreshed after."""
    inserted = dialect_insert(is_postgres, job_workers).values(
        {name: bindparam(f"worker_{name}") for name in WORKER_COLUMNS}
    )
    return inserted.on_conflict_do_update(
        index_elements=[job_workers.c.id],
        set_={
            name: getattr(inserted.excluded, name)
            for name in ("jobs", "heartbeat_at", "expires_at")
        },
    )


def beat_worker_values(row: WorkerRow) -> dict[str, Any]:
    """The parameters of :func:`beat_worker_statement` for ``row``."""
    return {f"worker_{name}": getattr(row, name) for name in WORKER_COLUMNS}


def forget_worker_statement() -> Any:
    """Delete the row of the worker ``worker_id`` (it stopped)."""
    return delete(job_workers).where(job_workers.c.id == bindparam("worker_id"))


def sweep_workers_statement() -> Any:
    """Delete the rows of workers gone by ``now_at``."""
    return delete(job_workers).where(not_(worker_is_live(bindparam("now_at", type_=Text))))


def live_workers_statement() -> Any:
    """The rows of workers live at ``now_at``, oldest first."""
    return (
        select(job_workers)
        .where(worker_is_live(bindparam("now_at", type_=Text)))
        .order_by(job_workers.c.started_at, job_workers.c.id)
    )
