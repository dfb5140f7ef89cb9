"""Starting many runs at once (``start_job_runs``), and when a start is due.

A batch is checked whole before anything is written (a refusal names the start
by its index), then handed to the store as one list of fresh rows, one per key:
a key given twice in a batch makes one row, and both positions get its record.
The store inserts the rows whose key has no live run and reads the live run of
each other key, in a fixed number of statements whatever the batch's size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobrun._core.model.fast_json import loads_own
from jobrun._core.model.formats import format_instant, parse_instant
from jobrun._core.model.names import require_name
from jobrun._core.model.queue_safety import encode_queue_safe
from jobrun._core.model.records import (
    DEFAULT_INSTANCE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    JobRun,
    RunRow,
    priority_value,
)
from jobrun._core.model.refusals import (
    checked_aware,
    checked_delay,
    in_item,
    refuse,
    refuse_type,
    type_name,
)
from jobrun._core.model.run_views import job_run_of
from jobrun._core.sources import Sources
from jobrun._core.time.aligned import aligned_clock
from jobrun._core.time.clock import ClockLike
from jobrun.errors import JobValidationError

if TYPE_CHECKING:
    # Annotations only: the port's worker rows read the waiting reason, which reads
    # this module's start-later rule.
    from jobrun._core.port import JobRunStore

Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStart:
    """One start for :func:`jobrun.start_job_runs`: the arguments :func:`jobrun.start_job_run`
    takes, as a value. ``start_at`` (an aware datetime, or ``None`` for now) is when
    the run becomes due; the run is live, and joined by later starts of its key, at once."""

    module_id: str
    job: str
    instance: str = DEFAULT_INSTANCE
    payload: Any = None
    priority: int = 0
    start_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CheckedStart:
    """A start whose every part was checked: what its row is built from."""

    key: Key
    payload_text: str
    priority: int
    start_at: datetime | None


def check_start(
    start: JobStart, max_payload_bytes: int, known_jobs: set[tuple[str, str]] | None = None
) -> CheckedStart:
    """Check one start's parts, in the order :func:`jobrun.start_job_run` checks them.
    ``known_jobs``: the (module id, job) pairs already checked, skipped (a batch's
    starts are mostly of a few jobs), and added to when good."""
    job_of = (start.module_id, start.job)
    if known_jobs is None or job_of not in known_jobs:
        require_name(start.module_id, "module_id")
        require_name(start.job, "job")
        if known_jobs is not None:
            known_jobs.add(job_of)
    require_name(start.instance, "instance", allow_empty=True)
    priority = start.priority
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        priority = priority_value(priority)  # refused, in its words (or an int subclass)
    start_at = None if start.start_at is None else checked_aware(start.start_at, "start_at")
    payload_text = encode_queue_safe(start.payload, "payload", max_payload_bytes)
    return CheckedStart(
        (start.module_id, start.job, start.instance), payload_text, priority, start_at
    )


def start_at_of(start_at: object, delay_s: object) -> datetime | timedelta | None:
    """``start_at`` (checked aware) or ``delay_s`` (as a timedelta); never both."""
    if start_at is not None and delay_s is not None:
        raise refuse("delay_s", "cannot be given with start_at: give one of them")
    if delay_s is not None:
        return timedelta(seconds=checked_delay(delay_s, "delay_s"))
    return None if start_at is None else checked_aware(start_at, "start_at")


def due_text(start_at: datetime | timedelta | None, now: datetime) -> str | None:
    """The stored due instant (``next_attempt_at``) of a run started at ``now``: ``None``
    (due at once) unless it starts later."""
    due = now + start_at if isinstance(start_at, timedelta) else start_at
    return format_instant(due) if due is not None and due > now else None


def new_run_row(
    *,
    run_id: str,
    key: Key,
    payload_text: str,
    priority: int,
    at: str,
    due_at: str | None = None,
) -> RunRow:
    """A fresh ``running`` row started at ``at``, due at ``due_at`` (``None``: at once)."""
    module_id, job, instance = key
    return RunRow(
        id=run_id,
        module_id=module_id,
        job=job,
        instance=instance,
        payload=payload_text,
        status="running",
        cursor=None,
        counters="{}",
        attempts=0,
        last_error=None,
        started_at=at,
        updated_at=at,
        # A run that starts later is a running run not due before then, as a
        # backing-off one is: the claim and every read already treat it so.
        next_attempt_at=due_at,
        ended_at=None,
        priority=priority,
    )


def _fresh_records(rows: list[RunRow]) -> list[JobRun]:
    """The records of rows just inserted: the first decoded whole, the others as it
    with their own parts (they differ in nothing else), so a batch of thousands
    does not decode every instant and empty counter again."""
    first = job_run_of(rows[0])
    records = [first]
    for row in rows[1:]:
        due = row.next_attempt_at
        records.append(
            JobRun(
                id=row.id,
                module_id=row.module_id,
                job=row.job,
                instance=row.instance,
                status=first.status,
                # The text is what encode_queue_safe just made (no NaN, no
                # Infinity), so jobrun's own reader reads it as decode_json would,
                # without building a decoder per call; each record its own object.
                payload=loads_own(row.payload),
                cursor=None,
                counters={},
                attempts=0,
                last_error=None,
                started_at=first.started_at,
                updated_at=first.updated_at,
                next_attempt_at=None if due is None else parse_instant(due),
                ended_at=None,
                priority=row.priority,
                job_version=first.job_version,
                outcome=first.outcome,
            )
        )
    return records


def started_record(row: RunRow, inserted: bool) -> JobRun:
    """The record a start returns: the run, and whether the start joined it."""
    record = job_run_of(row)
    return record if inserted else replace(record, joined=True)


def _checked_all(starts: Iterable[JobStart], max_payload_bytes: int) -> list[CheckedStart]:
    if isinstance(starts, str | bytes | dict) or not isinstance(starts, Iterable):
        raise refuse_type("starts", f"must be a list of JobStart, got {type_name(starts)}")
    checked = []
    known_jobs: set[tuple[str, str]] = set()
    for index, start in enumerate(starts):
        path = f"starts[{index}]"
        if not isinstance(start, JobStart):
            raise refuse_type(path, f"must be a JobStart, got {type_name(start)}")
        try:
            checked.append(check_start(start, max_payload_bytes, known_jobs))
        except JobValidationError as error:
            raise in_item(error, path) from None
    return checked


async def start_job_runs(
    sources: Sources,
    /,
    store: JobRunStore,
    starts: Iterable[JobStart],
    *,
    clock: ClockLike | None = None,
    connection: Any = None,
) -> list[JobRun]:
    """Start many runs at once: :func:`start_job_run` for each :class:`JobStart`, in a
    fixed number of statements (one when every key is new), atomically.

    Returns one record per start, in order, each as :func:`start_job_run` would
    (``joined`` says whether its key was live). A key given twice in ``starts``
    makes one run (the first start's payload, priority and ``start_at`` win) and
    both positions get its record. Every start is checked before anything is
    written: a refusal names the first bad one by its index (``starts[3].payload
    ...``) and nothing is started. Workers are woken once per batch.
    ``connection`` is as for :func:`start_job_run`.
    """
    checked = _checked_all(starts, store.limits.max_payload_bytes)
    if not checked:
        return []
    now = (await aligned_clock(store, clock, sources.clock)).now()
    at = format_instant(now)
    fresh: dict[Key, RunRow] = {}
    for start in checked:
        if start.key not in fresh:
            fresh[start.key] = new_run_row(
                run_id=sources.mint_id(),
                key=start.key,
                payload_text=start.payload_text,
                priority=start.priority,
                at=at,
                due_at=due_text(start.start_at, now),
            )
    stored = await store.start_many(list(fresh.values()), connection=connection)
    made = [row for row, inserted in stored if inserted]
    made_records = iter(_fresh_records(made) if made else [])
    records = {
        key: next(made_records) if inserted else started_record(row, inserted)
        for key, (row, inserted) in zip(fresh, stored, strict=True)
    }
    return [records[start.key] for start in checked]
