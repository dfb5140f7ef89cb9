"""The shapes that cross the store port, and the operator's record of a run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from jobrun._core.model.refusals import checked_int, checked_number, refuse

JOB_RUN_LIST_LIMIT = 50
JOB_RUN_LIST_MAX = 500
DEFAULT_INSTANCE = "default"


class JobRunStatus(StrEnum):
    """A run's status; members compare equal to their strings."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


STATUSES = frozenset(member.value for member in JobRunStatus)


@dataclass(frozen=True, slots=True)
class RunRow:
    """One ``_substrat_job_runs`` row exactly as stored (JSON and time as text)."""

    id: str
    module_id: str
    job: str
    instance: str
    payload: str
    status: str
    cursor: str | None
    counters: str
    attempts: int
    last_error: str | None
    started_at: str
    updated_at: str
    next_attempt_at: str | None
    ended_at: str | None
    lease_owner: str | None = None
    lease_driver: str | None = None
    lease_began_at: str | None = None
    lease_takeovers: int = 0
    priority: int = 0
    # Revision 0004: the fencing epoch (one more per claim and per lease handed
    # on), and the passes committed so far (the idempotency keys' pass number).
    lease_epoch: int = 0
    passes_committed: int = 0
    # Revision 0005: the passes deferred in a row (RetryAfter) and the last one's reason.
    deferrals: int = 0
    deferred_reason: str | None = None
    # Revision 0006: the version of the code that last committed the run (None: 1).
    job_version: int | None = None
    # Revision 0006: 1 when an operator cancelled the run (see predicates.is_cancelled).
    cancelled: int = 0
    # Revision 0006: where the last failure was raised ("file:line in function"),
    # beside last_error, whose "Type: message" text it leaves as it was.
    error_origin: str | None = None
    # Revision 0009: when an operator paused the run, and why (see predicates.is_paused).
    # Never part of a RunPatch: only the pause and unpause writes change them.
    paused_at: str | None = None
    pause_reason: str | None = None
    # Revision 0010: the lease's expiry on its host's boot clock (SQLite and memory;
    # NULL on Postgres and when no lease is held). See BootInstant.
    lease_boot_id: str | None = None
    lease_boot_expires_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RunPatch:
    """The whole mutable state of a run: every outcome writes all of it, never part.

    The lease fields are part of it: an outcome either hands the lease on to the
    next pass of the same driver or clears it. So are ``lease_epoch`` and
    ``passes_committed``: an outcome writes them back as read, or one higher;
    and ``deferrals`` and ``deferred_reason``: one more (and the reason) after a
    deferred pass, 0 and ``None`` after a commit or a failure; and ``job_version``:
    the committing code's version after a commit (or a cursor upgrade, see
    :mod:`jobrun._core.rules.versions`), as read after anything else.
    """

    status: str
    cursor: str | None
    counters: str
    attempts: int
    last_error: str | None
    updated_at: str
    next_attempt_at: str | None
    ended_at: str | None
    lease_owner: str | None = None
    lease_driver: str | None = None
    lease_began_at: str | None = None
    lease_takeovers: int = 0
    lease_epoch: int = 0
    passes_committed: int = 0
    deferrals: int = 0
    deferred_reason: str | None = None
    job_version: int | None = None
    error_origin: str | None = None
    # Revision 0010: the lease handed on, on the boot clock (None: cleared, or none).
    lease_boot_id: str | None = None
    lease_boot_expires_ms: int | None = None


@dataclass(frozen=True, slots=True)
class BootInstant:
    """A reading of this host's boot clock, in whole milliseconds (``CLOCK_BOOTTIME``:
    it never steps, and counts on through a suspend), the clock every process of one
    boot shares.

    ``boot_id`` names the clock: the kernel's boot id and the time namespace (whose
    offset the clock carries). A lease stores it with the lease's token
    (:meth:`lease_id`), so a lease written later by code that knows no boot clock
    (new token, old columns left behind) never matches it.
    """

    boot_id: str
    ms: int

    def lease_id(self, token: str) -> str:
        """The ``lease_boot_id`` stored beside lease ``token`` counted on this clock."""
        return f"{self.boot_id}@{token}"

    def lease(self, token: str, lease_ms: int) -> BootLease:
        """Lease ``token`` of ``lease_ms`` counted from this reading."""
        return BootLease(self.lease_id(token), self.ms + lease_ms)


@dataclass(frozen=True, slots=True)
class BootLease:
    """What a lease write stores on the boot clock: ``lease_boot_id`` and
    ``lease_boot_expires_ms``."""

    boot_id: str
    expires_ms: int


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a driver asks for: the oldest due run of a job it registers.

    ``expires_at`` gives, per ``(module_id, job)``, the lease expiry to write
    (jobs may have different lease lengths); ``skip_ids`` are runs this drive
    already had, so one call never gives a run more passes than it should.
    ``max_concurrent`` gives, for the jobs that have one, how many of their
    runs may be leased at once. ``by_age``: the due run that has been due
    longest, whatever its priority (one claim in ``FAIR_EVERY``, counted by the
    driver: see :mod:`jobrun._core.rules.fair_turns`); else the highest priority first.
    ``versions`` gives, per ``(module_id, job)``, the version of the driver's code
    for it (a job not in it: 1); a run whose stored version is newer is never
    claimed, orphaned or not (:func:`jobrun._core.model.predicates.runnable_by`).
    """

    now_at: str
    token: str
    driver: str
    expires_at: Mapping[tuple[str, str], str]
    skip_ids: frozenset[str] = frozenset()
    max_concurrent: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # Lease tokens whose holders were proven dead: such a run is taken over at
    # once, before any due run, whatever its lease's expiry says.
    dead_owners: frozenset[str] = frozenset()
    by_age: bool = False
    versions: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # The driver runs on real time: a store with a clock of its own (Postgres) judges
    # and counts this lease's expiries on it (a test clock's time is used as given).
    database_clock: bool = False
    # This host's boot clock, read with ``now_at`` (None: none, or a store with a
    # clock of its own): a lease counted on it is never taken while its expiry there
    # is ahead, whatever the wall clock says; each expiry in ``expires_at`` is
    # written on it too (``boot_expires_ms``, per job).
    boot: BootInstant | None = None
    boot_expires_ms: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One ``_substrat_job_schedules`` row: how far a schedule has got (times as stored text).

    ``schedule`` is the instance its runs share, or ``''`` when each slot's run
    has its own instance. ``cron`` is the expression whose slots ``last_slot_at``
    counts (``None`` on rows written before revision 0005).
    """

    module_id: str
    job: str
    schedule: str
    last_slot_at: str
    last_run_id: str | None
    updated_at: str
    cron: str | None


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A run held under a lease that has not expired: the candidates for proven death.

    ``presence_held`` is what the database knows of the holder's presence
    (Postgres: whether its advisory lock is held); ``None`` when it cannot say.
    """

    run_id: str
    module_id: str
    job: str
    lease_owner: str
    lease_driver: str | None
    lease_began_at: str | None
    presence_held: bool | None = None


@dataclass(frozen=True, slots=True)
class StepRow:
    """One ledger row. ``result`` not ``None`` means the step completed."""

    step: str
    result: str | None
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Equality filters of the operator read; ``None`` means any."""

    module_id: str | None = None
    job: str | None = None
    instance: str | None = None
    status: str | None = None
    limit: int = JOB_RUN_LIST_LIMIT
    # True: only the runs an operator cancelled (predicates.is_cancelled); None: any.
    cancelled: bool | None = None
    # True: only the live runs an operator paused (predicates.is_paused); None: any.
    paused: bool | None = None


@dataclass(frozen=True, slots=True)
class RunKey:
    """What a handler sees of its run: the id and the coalescing key."""

    id: str
    module_id: str
    job: str
    instance: str


@dataclass(frozen=True, slots=True)
class JobRun:
    """The operator's record of a run, decoded tolerantly.

    ``status`` is ``running``, ``done`` or ``failed`` (see :class:`JobRunStatus`).
    ``payload`` is what the run was started with; ``cursor`` and ``counters``
    are as of the last committed pass; ``attempts`` counts consecutive failed
    passes and ``last_error`` holds the latest failure (``Type: message``).
    ``next_attempt_at`` is when a backing-off run is due again, or, while a
    driver holds the run, its lease's expiry (also in ``lease_expires_at``, with
    the holder in ``lease_driver``, since ``lease_began_at``). Times are aware UTC
    datetimes.
    ``lease_epoch`` is the run's fencing epoch (one more at every claim and every
    lease handed on, see ``JobPass.lease_epoch``) and ``passes_committed`` the
    passes it has committed; both read 0 on a run no jobrun of revision 0004 or
    later has touched. ``deferrals`` counts the passes in a row that ended
    ``deferred`` (a handler or step raised ``RetryAfter``) and ``deferred_reason``
    is the last one's reason; a commit or a failure sets them back to 0 and
    ``None``. A running run with deferrals and no lease waits until
    ``next_attempt_at``. ``job_version`` is the version of the job's code that
    last committed the run (1 until a versioned job's code commits it, see
    ``JobRegistry.register``): only code of that version or newer claims it.
    ``cancelled`` says a ``failed`` run was cancelled by an
    operator (revision 0006; runs cancelled before it are marked by its migration).
    ``error_origin`` says where the last failure was raised (``"file:line in
    function"``, the innermost frame of the user's exception; revision 0006),
    ``None`` when no traceback said, and after a commit or a resume.
    ``outcome`` is how the run stands for people: its status, except ``cancelled``
    for a cancelled run and ``paused`` for a running run an operator paused (the
    one rule, ``jobrun._core.model.predicates.outcome_of``, that the console, the
    command line, the metrics and ``job_runs`` all use). ``paused_at`` and
    ``pause_reason`` say since when and why a running run is paused (revision
    0009; ``None`` when it is not, or no longer live); a paused run no lease holds
    waits with no ``next_attempt_at`` until it is unpaused.
    ``joined`` is set only on the record :func:`jobrun.start_job_run` (or
    :func:`jobrun.start_job_runs`) returns: ``True`` when the start joined a run of
    its key that was already live, ``False`` when it made a new run (and on every
    record read otherwise). It takes no part in equality.

    A JSON column that cannot be decoded does not make the record unreadable: it
    reads as its fallback (``None``, ``None``, ``{}``) and ``decode_error`` names
    the first such column (payload, then cursor, then counters).
    """

    id: str
    module_id: str
    job: str
    instance: str
    status: str
    payload: Any
    cursor: Any
    counters: dict[str, int | float]
    attempts: int
    last_error: str | None
    started_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None
    ended_at: datetime | None
    decode_error: str | None = None
    lease_driver: str | None = None
    lease_expires_at: datetime | None = None
    lease_takeovers: int = 0
    priority: int = 0
    lease_epoch: int = 0
    passes_committed: int = 0
    deferrals: int = 0
    deferred_reason: str | None = None
    job_version: int = 1
    lease_began_at: datetime | None = None
    cancelled: bool = False
    outcome: str = ""
    error_origin: str | None = None
    paused_at: datetime | None = None
    pause_reason: str | None = None
    # Not part of the run: how this record was got. Left out of equality, so the
    # record a start returns equals the one ``get_job_run`` reads back.
    joined: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class RateLimitBucket:
    """A rate limit's bucket as the database holds it, read for health."""

    key: str
    per_second: float
    burst: int
    tokens: float
    """Tokens now (refilled to the database's now); below zero, reservations are queued."""
    waiting: int
    """Takers holding a reservation for a token that has not refilled yet (see docs)."""
    empty_for_s: float
    """Seconds until the bucket holds a token again (0: it holds one now)."""
    cooling_until: str | None = None
    """While a ``RetryAfter(rate_limit=key)`` holds the bucket: until when (instant text)."""
    cooling_reason: str | None = None
    """And the reason it gave."""


@dataclass(frozen=True, slots=True)
class HealthCounts:
    """Raw counts for a dashboard, as the store reads them (times as stored text)."""

    running: int
    due: int
    leased: int
    failed: int
    oldest_due_at: str | None
    cancelled: int = 0
    paused: int = 0


@dataclass(frozen=True, slots=True)
class JobRunHealth:
    """How the job runs of one database are doing, for dashboards and alerts.

    The words are those of ``docs/design.md`` ("Words"); each running run is
    exactly one of due, leased or backing off.

    * ``running``: runs with status ``running`` (due, leased or backing off).
    * ``due``: running runs whose due instant has passed, so a driver claims
      them now: no lease and the backoff over, or stranded (a lease that
      expired). Includes runs of jobs no driver registers, which stay due until
      one does (``due_by_job`` tells which).
    * ``leased``: running runs held by a lease that has not expired (a pass in
      flight, unless its holder died: see ``orphaned``).
    * ``failed``: runs that ended ``failed`` and are still kept (until pruned),
      cancelled ones included: their stored status is ``failed``.
    * ``cancelled``: of the failed runs, those an operator cancelled (so
      ``failed - cancelled`` ended by an error).
    * ``oldest_due_age_s``: seconds the longest-waiting due run has waited (0
      when none), counted from its backoff's end or lease's expiry, else from its
      last write (a run released between two passes has waited since that
      pass's commit, not since its start): the number to alert on when drivers
      fall behind or a job is registered nowhere.
    * ``due_by_job``: ``{(module_id, job): due runs}``, the same due runs per job
      (filled when asked for with ``by_job=True``, else empty).
    * ``orphaned``: of the leased runs, those whose holder is provably dead (a
      driver takes them over at its next claim, before their lease expires).
    * ``rate_limits``: each rate-limit bucket of this database
      (:class:`jobrun.RateLimitBucket`: key, rate, burst, tokens now, takers
      waiting, seconds until a token is free), on the database's clock.
    * ``concurrency_slots``: ``{key: slots held}``, the step bodies in flight now
      per concurrency key (keys with none left out).
    * ``paused``: of the running runs, those an operator paused (the run, or its
      job: see :func:`jobrun.pause_job_run`); never due, and leased only while a
      pass still in flight ends at its next step. Runs whose pass was deferred by
      a paused limit key are not among them (they wait, with that reason).
    * ``paused_jobs``: ``{(module_id, job): PauseRecord}``, the jobs paused now
      (:func:`jobrun.pause_job`), each since when and why.
    * ``paused_limits``: ``{key: PauseRecord}``, the limit keys paused now
      (:func:`jobrun.pause_limit`).
    * ``versions_by_job``: ``{(module_id, job): {version: running runs}}``, the
      running runs of each job by the version of the code that last committed
      them (filled with ``by_job=True``). After a rollback, runs of a version
      newer than every worker's code wait here: no driver claims them.
    """

    running: int
    due: int
    leased: int
    failed: int
    oldest_due_age_s: float
    due_by_job: dict[tuple[str, str], int] = field(default_factory=dict)
    orphaned: int = 0
    rate_limits: tuple[RateLimitBucket, ...] = ()
    concurrency_slots: dict[str, int] = field(default_factory=dict)
    versions_by_job: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    cancelled: int = 0
    paused: int = 0
    paused_jobs: dict[tuple[str, str], PauseRecord] = field(default_factory=dict)
    paused_limits: dict[str, PauseRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """A pause that outlives any one run: a job's or a limit key's (revision 0009).

    ``paused_at`` is when it was paused (aware UTC), ``reason`` what the operator
    said (``None``: nothing)."""

    paused_at: datetime
    reason: str | None = None


@dataclass(slots=True)
class DriveError:
    """One failed pass in a :class:`JobDriveReport`: the run and its error text.

    ``error`` is the text stored as the run's ``last_error`` (``Type: message``).
    """

    run_id: str
    error: str


@dataclass(slots=True)
class JobDriveReport:
    """What one call of ``run_due_jobs`` did.

    ``attempted`` counts RUNS; every other number counts PASSES (with
    ``max_passes > 1`` one run can have several), so ``advanced + completed +
    retrying + failed + superseded + deferred + paused`` may exceed ``attempted``.

    * ``attempted``: runs claimed (leased) by this call, each counted once.
    * ``advanced``: passes that committed and left the run ``running``.
    * ``completed``: passes that committed ``done=True`` (the run is ``done``).
    * ``retrying``: passes that failed and scheduled a retry after a backoff.
    * ``failed``: passes that failed and ended the run ``failed`` (attempts
      spent, or a handler mistake), plus runs failed without a pass because
      their leases kept expiring (``max_takeovers``).
    * ``superseded``: passes that stopped because the run was no longer theirs
      (lease taken over, or cancelled or released by an operator).
    * ``deferred``: passes that ended by raising ``RetryAfter``: nothing
      committed or charged, the run due again after the delay it asked for; also
      passes whose step named a paused limit key (the run waits until it is unpaused).
    * ``paused``: passes that stopped at a step boundary because an operator
      paused the run: nothing committed or charged, the steps that finished kept.
    * ``errors``: one entry per ``retrying`` or ``failed`` pass: the run id and
      the error text stored as its ``last_error``.
    """

    attempted: int = 0
    advanced: int = 0
    completed: int = 0
    retrying: int = 0
    failed: int = 0
    superseded: int = 0
    deferred: int = 0
    errors: list[DriveError] = field(default_factory=list)
    paused: int = 0


def job_run_list_limit(limit: float | None) -> int:
    """Clamp an operator read's limit: absent or not finite is 50, else floor into [1, 500]."""
    if limit is None:
        return JOB_RUN_LIST_LIMIT
    checked_number(limit, "limit", wanted="a number or None")
    if not math.isfinite(limit):
        return JOB_RUN_LIST_LIMIT
    return min(JOB_RUN_LIST_MAX, max(1, math.floor(limit)))


PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1


def priority_value(priority: object) -> int:
    """Check a run's priority: an int that both engines' INTEGER column holds."""
    checked = checked_int(priority, "priority")
    if not PRIORITY_MIN <= checked <= PRIORITY_MAX:
        raise refuse(
            "priority",
            "out of the 32-bit range",
            message=f"priority must be within [{PRIORITY_MIN}, {PRIORITY_MAX}], got {checked}",
        )
    return checked


def status_filter(status: str | None) -> str | None:
    """Validate an operator read's status filter: a run status, ``cancelled`` (the
    failed runs an operator cancelled) or ``paused`` (the running runs an operator
    paused)."""
    if status is None:
        return None
    if status not in STATUSES and status not in ("cancelled", "paused"):
        allowed = ", ".join((*(member.value for member in JobRunStatus), "cancelled", "paused"))
        raise refuse(
            "status",
            f"{status!r} is not a run status",
            message=f"status filter {status!r} is not one of {allowed}",
        )
    return str(status)
