"""Retention: how long finished runs are kept, per job or for a whole database."""

from __future__ import annotations

from datetime import timedelta

from jobrun._core.actions import prune_job_runs
from jobrun._core.clock import ClockLike
from jobrun._core.port import OperatorStore
from jobrun._core.records import JobRunStatus
from jobrun._core.refusals import refuse, refuse_type, type_name
from jobrun._core.registry import JobRegistry
from jobrun._core.sources import Sources

FINISHED = (JobRunStatus.DONE.value, JobRunStatus.FAILED.value)
RETENTION_BATCH = 100
"""Runs deleted per transaction: short transactions that never hold up a claim for long."""


def check_prune_after(value: object) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise refuse_type("prune_after", f"must be a timedelta or None, got {type_name(value)}")
    if value <= timedelta(0):
        raise refuse("prune_after", f"must be positive, got {value}")
    return value


def retains(registry: JobRegistry, prune_after: timedelta | None) -> bool:
    """Whether there is anything to prune at all."""
    return prune_after is not None or any(job.keep_for is not None for job in registry)


async def prune_by_retention(
    store: OperatorStore,
    registry: JobRegistry,
    *,
    prune_after: timedelta | None,
    clock: ClockLike | None = None,
    batch_size: int = RETENTION_BATCH,
    sources: Sources,
) -> int:
    """Delete finished (done and failed) runs past their retention; returns how many.

    A job registered with ``keep_for`` keeps its runs that long; every other run
    in the database (of any job, registered here or not) is kept ``prune_after``,
    or forever when that is ``None``.
    """
    kept = {(job.module_id, job.name): job.keep_for for job in registry if job.keep_for}
    deleted = 0
    for key, keep_for in sorted(kept.items()):
        deleted += await prune_job_runs(
            store,
            older_than=keep_for,
            statuses=FINISHED,
            batch_size=batch_size,
            clock=clock,
            only_jobs=frozenset({key}),
            sources=sources,
        )
    if prune_after is not None:
        deleted += await prune_job_runs(
            store,
            older_than=prune_after,
            statuses=FINISHED,
            batch_size=batch_size,
            clock=clock,
            except_jobs=frozenset(kept),
            sources=sources,
        )
    return deleted
