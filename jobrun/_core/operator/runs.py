"""Starting runs and reading them back (the operator's side)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobrun._core.model.formats import format_instant
from jobrun._core.model.names import require_name, require_text
from jobrun._core.model.predicates import CANCELLED
from jobrun._core.model.queue_safety import encode_queue_safe
from jobrun._core.model.records import (
    DEFAULT_INSTANCE,
    JobRun,
    JobRunStatus,
    RunFilter,
    RunRow,
    job_run_list_limit,
    priority_value,
    status_filter,
)
from jobrun._core.model.refusals import checked_str
from jobrun._core.model.run_views import job_run_of
from jobrun._core.operator import starts
from jobrun._core.port import JobRunStore
from jobrun._core.sources import Sources
from jobrun._core.time.aligned import aligned_clock
from jobrun._core.time.clock import ClockLike


def new_run_row(
    *,
    run_id: str,
    module_id: str,
    job: str,
    instance: str,
    payload_text: str,
    priority: int,
    at: str,
) -> RunRow:
    """A fresh ``running`` row, due at ``at``."""
    return starts.new_run_row(
        run_id=run_id,
        key=(module_id, job, instance),
        payload_text=payload_text,
        priority=priority,
        at=at,
    )


async def start_job_run(
    store: JobRunStore,
    *,
    module_id: str,
    job: str,
    instance: str = DEFAULT_INSTANCE,
    payload: Any = None,
    priority: int = 0,
    start_at: datetime | None = None,
    delay_s: float | None = None,
    clock: ClockLike | None = None,
    connection: object | None = None,
    sources: Sources,
) -> JobRun:
    """:func:`jobrun.start_job_run`, handed its sources (the id minter, the system clock)."""
    require_name(module_id, "module_id")
    require_name(job, "job")
    require_name(instance, "instance", allow_empty=True)
    checked_priority = priority_value(priority)
    later = starts.start_at_of(start_at, delay_s)
    payload_text = encode_queue_safe(payload, "payload", store.limits.max_payload_bytes)
    # The database's time with the default clock: a fast local clock must not
    # date the run into the future, where no driver would see it due.
    now = (await aligned_clock(store, clock, sources.clock)).now()
    row = starts.new_run_row(
        run_id=sources.mint_id(),
        key=(module_id, job, instance),
        payload_text=payload_text,
        priority=checked_priority,
        at=format_instant(now),
        due_at=starts.due_text(later, now),
    )
    if connection is None:
        stored, inserted = await store.start_or_join(row)
    else:
        [(stored, inserted)] = await store.start_many([row], connection=connection)
    return starts.started_record(stored, inserted)


async def job_runs(
    store: JobRunStore,
    *,
    module_id: str | None = None,
    job: str | None = None,
    instance: str | None = None,
    status: str | None = None,
    limit: float | None = None,
) -> list[JobRun]:
    """Runs matching every given filter, newest first; ``limit`` is clamped into [1, 500].

    This is an operator's read with a page cap, not an iterator. To wait for many
    runs, keep the ids :func:`start_job_run` returned and read each with
    :func:`get_job_run`, or ask whether any is left:
    ``await job_runs(store, module_id=..., job=..., status="running", limit=1)``
    returns an empty list once none of that job's runs is live.

    ``status`` is a run status or ``"cancelled"``: the failed runs an operator
    cancelled (``JobRun.outcome``). ``"failed"`` matches the stored status, so it
    lists the cancelled runs too.
    """
    for argument, value in (("module_id", module_id), ("job", job), ("instance", instance)):
        if value is not None:
            wanted, subject = "a str or None", f"{argument} filter"
            require_text(checked_str(value, argument, wanted=wanted, subject=subject), subject)
    checked_status = status_filter(status)
    cancelled = checked_status == CANCELLED
    run_filter = RunFilter(
        module_id=module_id,
        job=job,
        instance=instance,
        # A cancelled run's stored status is failed; the marker tells it apart.
        status=JobRunStatus.FAILED.value if cancelled else checked_status,
        limit=job_run_list_limit(limit),
        cancelled=True if cancelled else None,
    )
    return [job_run_of(row) for row in await store.list(run_filter)]


async def get_job_run(store: JobRunStore, run_id: str) -> JobRun | None:
    """One run by id, whatever its status; ``None`` when there is none."""
    require_text(checked_str(run_id, "run_id"), "run_id")
    row = await store.get(run_id)
    return None if row is None else job_run_of(row)
