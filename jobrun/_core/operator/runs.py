"""Starting runs and reading them back (the operator's side)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jobrun._core.model.formats import format_instant
from jobrun._core.model.names import require_name, require_text
from jobrun._core.model.predicates import CANCELLED, PAUSED
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
    sources: Sources,
    /,
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
    connection: Any = None,
) -> JobRun:
    """Start a run, or join the live run of the same key (its payload and priority win).

    The key is ``(module_id, job, instance)``; ``instance`` (default
    ``"default"``) tells apart runs of one job that may be live side by side,
    such as one per customer. Returns the run's record: ``status`` is
    ``"running"``, its ``id`` is the one to keep, and ``joined`` says whether the
    start joined a run of the key that was already live (``True``) or made a new
    one (``False``). Nothing runs here: a driver (:func:`run_due_jobs`,
    :func:`run_worker`) picks the run up, at once, since a new run is due
    immediately, unless it starts later.

    ``start_at`` (a timezone-aware datetime) or ``delay_s`` (seconds from now),
    not both, makes the run start later: it is live at once (a start of its key
    joins it) but no driver claims it before then. Joining a run never moves its
    start.

    ``connection`` (a SQL store only): the caller's SQLAlchemy ``AsyncConnection``
    of the store's database, inside its open transaction (``async with
    engine.begin() as connection``, or ``await session.connection()`` of an ORM
    ``AsyncSession``). The run is written in that transaction: it exists, and
    workers are woken, only if the transaction commits. A second transaction
    starting the same key meanwhile waits for the first to end (commit: it joins
    that run; roll back: it makes its own).

    Everything is checked before anything is written: the key parts, the
    priority, the start instant, and the payload's queue-safety and size. The job
    need not be registered here; a run of a job no driver knows waits until one
    does. Among due runs, a higher ``priority`` is claimed first (default 0).
    """
    key = (module_id, job, instance)
    row = await _start_row(sources, store, key, payload, priority, (start_at, delay_s), clock)
    if connection is None:
        stored, inserted = await store.start_or_join(row)
    else:
        [(stored, inserted)] = await store.start_many([row], connection=connection)
    return starts.started_record(stored, inserted)


async def _start_row(
    sources: Sources,
    store: JobRunStore,
    key: tuple[str, str, str],
    payload: Any,
    priority: int,
    later: tuple[datetime | None, float | None],
    clock: ClockLike | None,
) -> RunRow:
    """The row a start writes, every argument checked first (``later``: its
    ``start_at`` and ``delay_s``)."""
    module_id, job, instance = key
    require_name(module_id, "module_id")
    require_name(job, "job")
    require_name(instance, "instance", allow_empty=True)
    checked_priority = priority_value(priority)
    starts_at = starts.start_at_of(*later)
    payload_text = encode_queue_safe(payload, "payload", store.limits.max_payload_bytes)
    # The database's time with the default clock: a fast local clock must not
    # date the run into the future, where no driver would see it due.
    now = (await aligned_clock(store, clock, sources.clock)).now()
    return starts.new_run_row(
        run_id=sources.mint_id(),
        key=key,
        payload_text=payload_text,
        priority=checked_priority,
        at=format_instant(now),
        due_at=starts.due_text(starts_at, now),
    )


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

    ``status`` is a run status, ``"cancelled"``: the failed runs an operator
    cancelled, or ``"paused"``: the running runs an operator paused
    (``JobRun.outcome``). ``"failed"`` and ``"running"`` match the stored status, so
    they list the cancelled and the paused runs too.
    """
    for argument, value in (("module_id", module_id), ("job", job), ("instance", instance)):
        if value is not None:
            wanted, subject = "a str or None", f"{argument} filter"
            require_text(checked_str(value, argument, wanted=wanted, subject=subject), subject)
    checked_status = status_filter(status)
    cancelled = checked_status == CANCELLED
    paused = checked_status == PAUSED
    if cancelled or paused:
        # A cancelled run's stored status is failed, a paused one's running; the
        # marker tells each apart.
        checked_status = JobRunStatus.FAILED.value if cancelled else JobRunStatus.RUNNING.value
    run_filter = RunFilter(
        module_id=module_id,
        job=job,
        instance=instance,
        status=checked_status,
        limit=job_run_list_limit(limit),
        cancelled=True if cancelled else None,
        paused=True if paused else None,
    )
    return [job_run_of(row) for row in await store.list(run_filter)]


async def get_job_run(store: JobRunStore, run_id: str) -> JobRun | None:
    """One run by id, whatever its status; ``None`` when there is none."""
    require_text(checked_str(run_id, "run_id"), "run_id")
    row = await store.get(run_id)
    return None if row is None else job_run_of(row)
