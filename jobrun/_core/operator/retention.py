"""Retention: how long finished runs are kept, per job, and for the jobs a worker registers.

A worker prunes the runs of the jobs its registry registers: a job's own
``keep_for``, else the worker's ``prune_after`` (or forever). Runs of jobs it
does not register belong to other applications: it prunes them only when told
to (``prune_unregistered_after``), and even then spares the runs younger than
their job's own ``keep_for`` as recorded by the workers that register it.
"""

from __future__ import annotations

from datetime import timedelta

from jobrun._core.engine.registry import JobRegistry
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import JobRunStatus
from jobrun._core.model.refusals import refuse, refuse_type, type_name
from jobrun._core.operator.actions import prune_job_runs
from jobrun._core.port import OperatorStore
from jobrun._core.sources import Sources
from jobrun._core.time.clock import ClockLike

FINISHED = (JobRunStatus.DONE.value, JobRunStatus.FAILED.value)
RETENTION_BATCH = 100
"""Runs deleted per transaction: short transactions that never hold up a claim for long."""

JobKey = tuple[str, str]


def check_prune_after(value: object, name: str = "prune_after") -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise refuse_type(name, f"must be a timedelta or None, got {type_name(value)}")
    if value <= timedelta(0):
        raise refuse(name, f"must be positive, got {value}")
    return value


def retains(
    registry: JobRegistry,
    prune_after: timedelta | None,
    prune_unregistered_after: timedelta | None = None,
) -> bool:
    """Whether there is anything to prune at all."""
    return (
        prune_after is not None
        or prune_unregistered_after is not None
        or any(job.keep_for is not None for job in registry)
    )


def _whole_seconds(keep_for: timedelta | None) -> int | None:
    # Rounded up: a recorded retention never keeps less than the registered one.
    return None if keep_for is None else -int(-keep_for.total_seconds() // 1)


async def prune_by_retention(
    store: OperatorStore,
    registry: JobRegistry,
    *,
    prune_after: timedelta | None,
    prune_unregistered_after: timedelta | None = None,
    clock: ClockLike | None = None,
    batch_size: int = RETENTION_BATCH,
    sources: Sources,
) -> int:
    """Delete finished (done and failed) runs past their retention; returns how many.

    First records the ``keep_for`` of each job ``registry`` registers (none: the
    record goes), so workers that do not register it know it. A job registered
    with ``keep_for`` keeps its runs that long; the other jobs registered here are
    kept ``prune_after`` (``None``: forever). Runs of jobs not registered here are
    kept forever, unless ``prune_unregistered_after`` is given: then that long, or
    their job's recorded ``keep_for`` when it is longer.
    """
    own = {(job.module_id, job.name): job.keep_for for job in registry}
    at = format_instant(sources.clock_for(clock).now())
    await store.record_retention({key: _whole_seconds(kept) for key, kept in own.items()}, at)
    plan: list[tuple[timedelta, frozenset[JobKey] | None, frozenset[JobKey]]] = [
        (kept, frozenset({key}), frozenset()) for key, kept in sorted(own.items()) if kept
    ]
    plain = frozenset(key for key, kept in own.items() if kept is None)
    if prune_after is not None and plain:
        plan.append((prune_after, plain, frozenset()))
    if prune_unregistered_after is not None:
        recorded = {
            key: timedelta(seconds=seconds)
            for key, seconds in (await store.recorded_retention()).items()
            if key not in own
        }
        for key, kept in sorted(recorded.items()):
            plan.append((max(kept, prune_unregistered_after), frozenset({key}), frozenset()))
        plan.append((prune_unregistered_after, None, frozenset(own) | frozenset(recorded)))
    deleted = 0
    for older_than, only_jobs, except_jobs in plan:
        deleted += await prune_job_runs(
            sources,
            store,
            older_than=older_than,
            statuses=FINISHED,
            batch_size=batch_size,
            clock=clock,
            only_jobs=only_jobs,
            except_jobs=except_jobs,
        )
    return deleted
