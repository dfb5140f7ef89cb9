"""What an operator does by hand: cancel, resume, release, prune.

Each action is one conditional write of a change built in
:mod:`jobrun._core.rules.transitions`, so it can race a pass in flight safely:
the pass's own writes are fenced on its lease and on ``status = 'running'``, so
after a cancel or a release the pass writes nothing more.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jobrun._core.leases.proof_of_death import dead_holders
from jobrun._core.model.formats import format_instant, parse_instant, repaired_counters
from jobrun._core.model.names import require_text
from jobrun._core.model.records import JobRun, JobRunHealth, JobRunStatus, RunRow
from jobrun._core.model.refusals import (
    checked_positive_int,
    checked_str,
    refuse,
    refuse_type,
    type_name,
)
from jobrun._core.model.run_views import job_run_of
from jobrun._core.port import OperatorStore
from jobrun._core.rules.transitions import cancel_transition, release_transition, resume_transition
from jobrun._core.sources import Sources
from jobrun._core.time.aligned import aligned_clock
from jobrun._core.time.clock import ClockLike
from jobrun.errors import JobConflictError, JobRunNotFoundError

_EARLIEST = datetime.min.replace(tzinfo=UTC)
PRUNABLE = frozenset({JobRunStatus.DONE.value, JobRunStatus.FAILED.value})


def checked_run_id(run_id: object) -> str:
    """``run_id`` as an operation by hand takes it: a str without NUL."""
    return require_text(checked_str(run_id, "run_id"), "run_id")


async def stored_row(store: OperatorStore, run_id: str) -> RunRow:
    """Run ``run_id``'s row; :class:`JobRunNotFoundError` when there is none."""
    row = await store.get(run_id)
    if row is None:
        raise JobRunNotFoundError(run_id)
    return row


async def _record(store: OperatorStore, run_id: str) -> JobRun:
    return job_run_of(await stored_row(store, run_id))


async def cancel_job_run(
    sources: Sources,
    /,
    store: OperatorStore,
    run_id: str,
    reason: str,
    *,
    clock: ClockLike | None = None,
) -> JobRun:
    """Fail a running run now, with ``reason`` on the record.

    A pass in flight notices at its next step (its write is refused) and stops.
    The ledger is kept, so :func:`resume_job_run` does not repeat finished steps.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise refuse(
            "reason", "empty or not a str", message="a cancellation needs a reason for the record"
        )
    require_text(reason, "reason")
    checked_run_id(run_id)
    at = format_instant(sources.clock_for(clock).now())
    if not await store.cancel(run_id, cancel_transition(f"cancelled: {reason}", at)):
        record = await _record(store, run_id)
        raise JobConflictError(
            f"run {run_id} is {record.status}, not running; nothing to cancel",
            "job_run_not_running",
        )
    return await _record(store, run_id)


async def resume_job_run(
    sources: Sources, /, store: OperatorStore, run_id: str, *, clock: ClockLike | None = None
) -> JobRun:
    """Put a failed run back to running, from its last committed cursor.

    Its last pass's completed steps are kept (not repeated); attempts start
    again from zero. Refused while another run of the same key is live.
    Counters that are malformed (written by something other than ``p.count``)
    are repaired: every entry that is a finite number is kept, the rest dropped
    (counters that are not a JSON object at all start again from ``{}``).
    """
    row = await store.get(checked_run_id(run_id))
    counters = None if row is None else repaired_counters(row.counters)
    at = format_instant(sources.clock_for(clock).now())
    # A run of a paused job comes back paused, as a run started now would.
    paused_jobs = (await store.pauses())[0] if row is not None else {}
    job_pause = None if row is None else paused_jobs.get((row.module_id, row.job))
    paused = None if job_pause is None else (at, job_pause.reason)
    if not await store.resume(run_id, resume_transition(at, counters, paused)):
        record = await _record(store, run_id)
        raise JobConflictError(
            f"run {run_id} is {record.status}, not failed; only a failed run can resume",
            "job_run_not_failed",
        )
    return await _record(store, run_id)


async def release_job_lease(store: OperatorStore, run_id: str) -> bool:
    """Clear a run's lease by hand so any driver may take it at once.

    Returns whether a lease was held. The holder, if still alive, is refused at
    its next write and stops.
    """
    checked_run_id(run_id)
    if await store.release(run_id, release_transition()):
        return True
    await _record(store, run_id)
    return False


async def job_run_health(
    sources: Sources,
    /,
    store: OperatorStore,
    *,
    by_job: bool = False,
    clock: ClockLike | None = None,
) -> JobRunHealth:
    """Counts for a dashboard: running, due now, leased, failed, the oldest due age,
    and the leased runs whose holder is provably dead (``orphaned``).

    A stranded run (its lease expired) is due, not leased: it waits for a driver
    like any other due run. An orphaned run is still leased until its lease
    expires, though a driver takes it over at once. With ``by_job`` (one more
    read) ``due_by_job`` says which jobs the due runs belong to: a job that no
    driver registers shows up there and never drains; and (one more)
    ``versions_by_job`` counts each job's running runs by stored version: runs of
    a version newer than every worker's code (after a rollback) are never claimed.
    """
    now = (await aligned_clock(store, clock, sources.clock)).now()
    now_at = format_instant(now)
    counts = await store.health(now_at)
    dead = await dead_holders(store, now_at, None, sources.host)
    due_by_job = dict(sorted((await store.due_by_job(now_at)).items())) if by_job else {}
    versions = dict(sorted((await store.versions_by_job()).items())) if by_job else {}
    limits = await store.limit_usage(now_at)
    paused_jobs, paused_limits = await store.pauses()
    waited_s = 0.0
    if counts.oldest_due_at is not None:
        waited_s = max(0.0, (now - parse_instant(counts.oldest_due_at)).total_seconds())
    return JobRunHealth(
        running=counts.running,
        due=counts.due,
        leased=counts.leased,
        failed=counts.failed,
        oldest_due_age_s=waited_s,
        due_by_job=due_by_job,
        orphaned=len(dead),
        rate_limits=limits.buckets,
        concurrency_slots=dict(limits.slots),
        versions_by_job={job: dict(sorted(counts.items())) for job, counts in versions.items()},
        cancelled=counts.cancelled,
        paused=counts.paused,
        paused_jobs=paused_jobs,
        paused_limits=paused_limits,
    )


async def prune_job_runs(
    sources: Sources,
    /,
    store: OperatorStore,
    *,
    older_than: timedelta | datetime,
    statuses: tuple[str, ...] = (JobRunStatus.DONE.value,),
    batch_size: int = 500,
    clock: ClockLike | None = None,
    only_jobs: frozenset[tuple[str, str]] | None = None,
    except_jobs: frozenset[tuple[str, str]] = frozenset(),
) -> int:
    """Delete finished runs that ended before a cutoff, with their ledgers.

    ``older_than`` is an age (``timedelta``) or an aware cutoff instant.
    Running runs are never deleted. Works in batches of ``batch_size`` runs, one
    short transaction each. ``only_jobs`` limits it to runs of those
    ``(module_id, job)`` pairs; runs of ``except_jobs`` are kept. Returns how
    many runs were deleted.
    """
    wanted = tuple(statuses)
    unknown = [status for status in wanted if status not in PRUNABLE]
    if not wanted or unknown:
        raise refuse(
            "statuses",
            f"not prunable: {unknown!r}",
            message=f"statuses must be drawn from done and failed, got {list(wanted)!r}",
        )
    checked_positive_int(batch_size, "batch_size")
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):
            raise refuse("older_than", f"must not be negative, got {older_than}")
        now = sources.clock_for(clock).now()
        # An age reaching before year 1 keeps everything: nothing ended that long ago.
        cutoff = now - older_than if older_than < now - _EARLIEST else _EARLIEST
    elif isinstance(older_than, datetime):
        cutoff = older_than
    else:
        raise refuse_type(
            "older_than", f"must be a timedelta or datetime, got {type_name(older_than)}"
        )
    return await store.prune(
        format_instant(cutoff),
        wanted,
        batch_size,
        only_jobs=None if only_jobs is None else frozenset(only_jobs),
        except_jobs=frozenset(except_jobs),
    )
