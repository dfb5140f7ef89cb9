"""The public entry points: where the real sources are chosen, once, and handed to the core.

``jobrun._core`` reads no real source (no clock, entropy, ``/proc`` or process
id; import-linter checks it). Its functions take a
:class:`~jobrun._core.sources.Sources`, and the functions users call are these
thin wrappers, which hand it :data:`SYSTEM_SOURCES`: the system clock, the
process's id minter, its identity and view of other processes, the watchdog,
its default driver name and the system's random numbers, all from
``jobrun._system`` and ``jobrun._watchdog``. Their signatures and behaviour are
the public API; the worker hands the same sources to the core it drives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobrun._core import (
    DEFAULT_INSTANCE,
    ClockLike,
    DriveKeywords,
    DriveOptions,
    JobDriveReport,
    JobRegistry,
    JobRun,
    JobRunHealth,
    JobRunStatus,
    JobRunStore,
    JobStart,
    OperatorStore,
    ScheduleStore,
    Sources,
    actions,
    drive,
    drive_options,
    runs,
    scheduled_runs,
)
from jobrun._core import starts as starts_core
from jobrun._system import (
    SYSTEM_CLOCK,
    THIS_HOST,
    default_driver_name,
    mint_run_id,
    system_random,
)
from jobrun._watchdog import real_time_guard

if TYPE_CHECKING:
    from typing_extensions import Unpack

SYSTEM_SOURCES = Sources(
    clock=SYSTEM_CLOCK,
    mint_id=mint_run_id,
    random=system_random,
    host=THIS_HOST,
    driver_name=default_driver_name,
    guard=real_time_guard,
)
"""The machine this process runs on, as every public entry point hands it to the core."""


async def run_due_jobs(
    store: JobRunStore,
    registry: JobRegistry,
    *,
    options: DriveOptions | None = None,
    stop: asyncio.Event | None = None,
    **keywords: Unpack[DriveKeywords],
) -> JobDriveReport:
    """Advance up to ``limit`` due runs of registered jobs by up to ``max_passes`` passes each.

    This is the bounded driver: it returns when nothing registered is due or the
    bounds are reached, so the host calls it again, from a loop, a timer or a
    scheduler tick (:func:`run_worker` is such a loop). A run that is backing off
    after a failure is not due until its ``next_attempt_at``.

    How it drives (``limit``, ``max_passes``, ``pass_timeout_s``, ``open_scope``,
    ``driver_name``, ``observer``, ``clock``, ``random``) is a
    :class:`jobrun.DriveOptions`: pass one as ``options``, or its fields as
    keywords (``run_due_jobs(store, registry, max_passes=10)``); keywords given
    with ``options`` replace those fields. A bad value raises
    :class:`jobrun.JobValidationError` before anything is read.

    Runs are leased one at a time, in the order they became due, so any number of
    drivers may share a database: each run is driven by one of them at a time.
    A run's failure is recorded on the run and reported, never raised, whatever
    the handler raised; only the store's own failures (a lost database) escape,
    and a write that would have released a lease then is sent again before the
    next claim on the same store, so the run need not wait for its lease to
    expire. A ``KeyboardInterrupt`` or ``SystemExit`` raised inside a handler or
    step (``sys.exit()``) is recorded as that run's failed attempt, releasing its
    lease, and then raised again, so it still stops the program. When ``stop`` is
    set, no new run is claimed and the run in hand gets no further pass.

    ``observer`` hears each pass and its steps (see ``jobrun.PassObserver``); by
    default they are logged on the ``jobrun.pass`` and ``jobrun.step`` loggers.
    """
    chosen = drive_options(options, keywords)
    return await drive.drive_due_jobs(store, registry, chosen, SYSTEM_SOURCES, stop=stop)


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
    return await runs.start_job_run(
        store,
        module_id=module_id,
        job=job,
        instance=instance,
        payload=payload,
        priority=priority,
        start_at=start_at,
        delay_s=delay_s,
        clock=clock,
        connection=connection,
        sources=SYSTEM_SOURCES,
    )


async def start_job_runs(
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
    return await starts_core.start_job_runs(
        store, starts, clock=clock, connection=connection, sources=SYSTEM_SOURCES
    )


async def start_scheduled_runs(
    store: ScheduleStore,
    registry: JobRegistry,
    *,
    now: datetime | None = None,
    clock: ClockLike | None = None,
) -> list[JobRun]:
    """Start the run of every due slot of ``registry``'s schedules; returns those runs.

    Call it from the host's own loop (``jobrun worker`` and :func:`jobrun.run_worker`
    call it at each slot). Any number of callers on any number of hosts may call
    it at once: each slot is started by one of them, once, and never again,
    whether or not its run has ended since. A schedule seen for the first time,
    or whose cron changed, starts with its next slot (no slot of an older cron is
    replayed). The stored state of schedules that ``registry`` no longer declares
    for the jobs it registers is deleted (other jobs' schedules are left alone).
    Costs one read when nothing is due, and one short transaction per slot
    started. ``now`` (default: the clock's) is the instant slots are due by.
    """
    return await scheduled_runs.start_scheduled_runs(
        store, registry, now=now, clock=clock, sources=SYSTEM_SOURCES
    )


async def cancel_job_run(
    store: OperatorStore, run_id: str, reason: str, *, clock: ClockLike | None = None
) -> JobRun:
    """Fail a running run now, with ``reason`` on the record.

    A pass in flight notices at its next step (its write is refused) and stops.
    The ledger is kept, so :func:`resume_job_run` does not repeat finished steps.
    """
    return await actions.cancel_job_run(store, run_id, reason, clock=clock, sources=SYSTEM_SOURCES)


async def resume_job_run(
    store: OperatorStore, run_id: str, *, clock: ClockLike | None = None
) -> JobRun:
    """Put a failed run back to running, from its last committed cursor.

    Its last pass's completed steps are kept (not repeated); attempts start
    again from zero. Refused while another run of the same key is live.
    Counters that are malformed (written by something other than ``p.count``)
    are repaired: every entry that is a finite number is kept, the rest dropped
    (counters that are not a JSON object at all start again from ``{}``).
    """
    return await actions.resume_job_run(store, run_id, clock=clock, sources=SYSTEM_SOURCES)


async def job_run_health(
    store: OperatorStore, *, by_job: bool = False, clock: ClockLike | None = None
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
    return await actions.job_run_health(store, by_job=by_job, clock=clock, sources=SYSTEM_SOURCES)


async def prune_job_runs(
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
    return await actions.prune_job_runs(
        store,
        older_than=older_than,
        statuses=statuses,
        batch_size=batch_size,
        clock=clock,
        only_jobs=only_jobs,
        except_jobs=except_jobs,
        sources=SYSTEM_SOURCES,
    )
