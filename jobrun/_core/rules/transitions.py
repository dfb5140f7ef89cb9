"""A run's state changes, decided here once; the stores only choose rows and apply.

Every change to a run is built here, with no I/O: what a claim writes (a fresh
lease, or the takeover of an expired or dead holder's lease with its accounting
and the text users see in ``last_error``), what an operator's cancel, resume and
release write, and the row a pass's holder writes when the pass ends (a commit,
a failure, a deferral, a hand-back; :mod:`jobrun._core.engine.outcomes` sends those
writes, fenced on the holder's lease, and reads their answers).

A claim's new state depends on the row it found, so a store reads the chosen
row, asks :func:`claim_transition`, and writes the answer fenced on every value
the decision read (a compare-and-set): if the row changed in between, the write
applies to nothing and the store looks again. The operators' changes do not
depend on the row beyond its status, so each is a :class:`RunChange`: the
values to set and the condition under which they apply, one conditional write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jobrun._core.leases.renewal import Lease
from jobrun._core.model.predicates import (
    PARKED_AT,
    boot_held,
    due_at,
    is_due,
    is_leased,
    is_live,
    is_paused,
    parked,
    runnable_by,
)
from jobrun._core.model.records import (
    BootInstant,
    ClaimRequest,
    JobRunStatus,
    RunPatch,
    RunRow,
)

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value
DONE = JobRunStatus.DONE.value

# The fields a claim writes (and, with status, the values its write is fenced on).
CLAIM_FIELDS = (
    "lease_owner",
    "lease_driver",
    "lease_began_at",
    "next_attempt_at",
    "lease_takeovers",
    "attempts",
    "last_error",
    "lease_epoch",
    "lease_boot_id",
    "lease_boot_expires_ms",
)


@dataclass(frozen=True, slots=True)
class PreviousHolder:
    """Whose lease a claim took over: its token, its driver, when its pass began,
    and whether it was proven dead (else its lease had expired)."""

    owner: str
    driver: str | None
    began_at: str | None
    died: bool


@dataclass(frozen=True, slots=True)
class Claimed:
    """What a claim did: the run as written, and the holder it took the run from
    (``None``: the run was not leased, a fresh claim). ``ledger_empty``: the store
    knows the run's ledger held no rows when it was leased (so its first pass
    need not read it); ``False`` says nothing."""

    row: RunRow
    previous: PreviousHolder | None = None
    ledger_empty: bool = False

    @property
    def taken_over(self) -> bool:
        return self.previous is not None


def is_orphan(row: RunRow, request: ClaimRequest) -> bool:
    """Orphaned: leased, by a holder proven dead. Claimed first, before its lease
    expires, and outside per-job limits (it adds no pass in flight)."""
    return is_leased(row, request.now_at) and row.lease_owner in request.dead_owners


def takeover_note_parts(died: bool) -> tuple[str, str]:
    """The text before and after the driver's name in :func:`takeover_note` (the
    Postgres claim, which writes it in SQL, splices the name in between)."""
    if died:
        return "the driver ", " died during a pass; the run was taken over at once"
    return "the lease of driver ", " expired during a pass; the run was taken over"


def takeover_note(previous: PreviousHolder) -> str:
    """``last_error`` after taking over a pass that had begun."""
    before, after = takeover_note_parts(previous.died)
    return f"{before}{previous.driver}{after}"


def claim_transition(row: RunRow, request: ClaimRequest) -> Claimed:
    """The run after ``request`` leases it: a fresh lease, and when another
    driver's lease was still on it, the takeover counted (one more takeover and,
    if its pass had begun, one attempt charged, with why in ``last_error``).
    Every claim raises the run's fencing epoch by one. With a boot clock, the
    lease's expiry is written on it too."""
    job = (row.module_id, row.job)
    boot = request.boot
    leased = replace(
        row,
        lease_owner=request.token,
        lease_driver=request.driver,
        lease_began_at=request.now_at,
        next_attempt_at=request.expires_at[job],
        lease_epoch=row.lease_epoch + 1,
        lease_boot_id=None if boot is None else boot.lease_id(request.token),
        lease_boot_expires_ms=None if boot is None else request.boot_expires_ms[job],
    )
    if row.lease_owner is None:
        return Claimed(leased)
    previous = PreviousHolder(
        row.lease_owner,
        row.lease_driver,
        row.lease_began_at,
        died=row.lease_owner in request.dead_owners,
    )
    began = previous.began_at is not None
    claimed = replace(
        leased,
        lease_takeovers=row.lease_takeovers + 1,
        attempts=row.attempts + (1 if began else 0),
        last_error=takeover_note(previous) if began else row.last_error,
    )
    return Claimed(claimed, previous)


def takeovers_exceeded_reason(takeovers: int, max_takeovers: int) -> str:
    """``last_error`` of a run failed because its passes keep outliving their leases."""
    return (
        f"the run was taken over {takeovers} times in a row (its passes keep "
        f"outliving their drivers' leases; the limit is {max_takeovers})"
    )


def in_flight(rows: Iterable[RunRow], now_at: str) -> dict[tuple[str, str], int]:
    """Per job, its leased runs (:func:`~jobrun._core.model.predicates.is_leased`)."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        if is_leased(row, now_at):
            counts[(row.module_id, row.job)] = counts.get((row.module_id, row.job), 0) + 1
    return counts


def claim_candidate(rows: Sequence[RunRow], request: ClaimRequest) -> RunRow | None:
    """Which of ``rows`` a claim gets, by the rules every store follows: an orphan
    first; else the due run first in order (highest ``priority``, then due
    instant, then id; with ``by_age``, due instant then id, priority ignored)
    among jobs below their ``max_concurrent`` and not in ``skip_ids``. Neither
    kind is taken when its stored version is newer than the driver's code for it,
    nor when it is paused; nor a due run still held on the claimer's boot clock
    (:func:`~jobrun._core.model.predicates.boot_held`: its wall expiry only looks past)."""
    wanted = [
        row
        for row in rows
        if is_live(row)
        and not is_paused(row)
        and (row.module_id, row.job) in request.expires_at
        and runnable_by(row, request.versions)
    ]
    orphans = [row for row in wanted if is_orphan(row, request)]
    if orphans:
        return orphans[0]
    leased = in_flight(rows, request.now_at)
    full = {job for job, most in request.max_concurrent.items() if leased.get(job, 0) >= most}
    due = [
        row
        for row in wanted
        if is_due(row, request.now_at)
        and not boot_held(row, request.boot)
        and (row.module_id, row.job) not in full
        and row.id not in request.skip_ids
    ]
    if request.by_age:
        return min(due, key=lambda row: (due_at(row), row.id), default=None)
    return min(due, key=lambda row: (-row.priority, due_at(row), row.id), default=None)


Value = str | int | None


@dataclass(frozen=True, slots=True)
class RunChange:
    """A conditional write: ``values`` (column, value) apply to a run whose status
    is ``status`` and, when ``leased``, that holds a lease, and when ``paused`` is
    not ``None``, whose ``paused_at`` is set (``True``) or not (``False``); to no
    other.

    The run's due instant follows the pause (:func:`applied`): a change that does
    not write ``next_attempt_at`` takes the run out of :data:`PARKED_AT` (an
    unpause makes it due at once), and a paused run left without a lease waits
    there (:func:`jobrun._core.model.predicates.parked`)."""

    status: str
    values: tuple[tuple[str, Value], ...]
    leased: bool = False
    paused: bool | None = None

    def applies_to(self, row: RunRow) -> bool:
        if self.paused is not None and (row.paused_at is not None) != self.paused:
            return False
        return row.status == self.status and (not self.leased or row.lease_owner is not None)

    def applied(self, row: RunRow) -> RunRow:
        values: dict[str, Any] = dict(self.values)
        if "next_attempt_at" not in values and row.next_attempt_at == PARKED_AT:
            values["next_attempt_at"] = None
        return parked(replace(row, **values))


_UNLEASED: tuple[tuple[str, Value], ...] = (
    ("next_attempt_at", None),
    ("lease_owner", None),
    ("lease_driver", None),
    ("lease_began_at", None),
    ("lease_boot_id", None),
    ("lease_boot_expires_ms", None),
)


# A run that ends or starts over counts no deferrals (see deferred_patch).
_NOT_DEFERRED: tuple[tuple[str, Value], ...] = (("deferrals", 0), ("deferred_reason", None))

# A cancelled run is no longer paused; a resumed one is unless its job is.
_NOT_PAUSED: tuple[tuple[str, Value], ...] = (("paused_at", None), ("pause_reason", None))


def cancel_transition(reason: str, at: str) -> RunChange:
    """A running run fails now with ``reason``; its lease goes, so the holder's next
    write is refused (its ledger is kept for a resume)."""
    return RunChange(
        RUNNING,
        (
            ("status", FAILED),
            ("last_error", reason),
            ("updated_at", at),
            ("ended_at", at),
            ("cancelled", 1),
            ("error_origin", None),
            *_UNLEASED,
            *_NOT_DEFERRED,
            *_NOT_PAUSED,
        ),
    )


def resume_transition(
    at: str, counters: str | None = None, paused: tuple[str, str | None] | None = None
) -> RunChange:
    """A failed run runs again, due at once, with no attempts, takeovers or deferrals counted;
    ``counters`` (when given) replace the stored ones. With ``paused`` (its job's
    pause: since when, why) it comes back paused, as a run started now would. The
    store also gives the failed ledger rows their attempts back."""
    pause = _NOT_PAUSED if paused is None else (("paused_at", at), ("pause_reason", paused[1]))
    values: tuple[tuple[str, Value], ...] = (
        ("status", RUNNING),
        ("attempts", 0),
        ("lease_takeovers", 0),
        ("updated_at", at),
        ("ended_at", None),
        ("cancelled", 0),
        ("error_origin", None),
        *_UNLEASED,
        *_NOT_DEFERRED,
        *pause,
    )
    if counters is not None:
        values += (("counters", counters),)
    return RunChange(FAILED, values)


def release_transition() -> RunChange:
    """A held lease is cleared by hand: the run is due at once, nothing charged."""
    return RunChange(RUNNING, _UNLEASED, leased=True)


# --- The end of a pass: what its holder writes, fenced on its lease ----------------------------


def unleased(row: RunRow) -> RunPatch:
    """The row's state as claimed, minus the lease: due again at once, nothing charged."""
    return RunPatch(
        status=row.status,
        cursor=row.cursor,
        counters=row.counters,
        attempts=row.attempts,
        last_error=row.last_error,
        updated_at=row.updated_at,
        next_attempt_at=None,
        ended_at=row.ended_at,
        lease_takeovers=row.lease_takeovers,
        lease_epoch=row.lease_epoch,
        passes_committed=row.passes_committed,
        deferrals=row.deferrals,
        deferred_reason=row.deferred_reason,
        job_version=row.job_version,
        error_origin=row.error_origin,
    )


def committed_patch(
    row: RunRow,
    cursor_json: str | None,
    counters_json: str,
    done: bool,
    at: str,
    lease: Lease,
    successor: Lease | None,
    version: int,
    *,
    expires_from: str | None = None,
    boot: BootInstant | None = None,
) -> RunPatch:
    """The row after a pass that succeeded; with a ``successor``, still leased to this driver.

    One more pass committed; a lease handed on is a new holder as far as the
    outside world can tell, so it gets the next epoch, as a claim would. The run
    is now of ``version``, the committing code's. The lease handed on expires
    counted from ``expires_from`` (default ``at``): the instant expiries are
    written on, which a wall-clock step cannot move back (``wallsteps``), and, with
    a ``boot`` clock read with it, on that clock too.
    """
    kept = successor is not None
    boot_lease = (
        None if successor is None or boot is None else boot.lease(successor.token, lease.lease_ms)
    )
    return RunPatch(
        status=DONE if done else RUNNING,
        cursor=cursor_json,
        counters=counters_json,
        attempts=0,
        last_error=None,
        updated_at=at,
        # An outcome writes the real due time (now: NULL), never a lease
        # expiry, unless it hands the lease to this driver's next pass.
        next_attempt_at=lease.expiry_after(expires_from or at) if kept else None,
        ended_at=at if done else None,
        lease_owner=successor.token if successor is not None else None,
        lease_driver=lease.driver if kept else None,
        lease_began_at=at if kept else None,
        lease_takeovers=0,
        lease_epoch=row.lease_epoch + 1 if kept else row.lease_epoch,
        passes_committed=row.passes_committed + 1,
        # Defaults of RunPatch, spelled out: a commit ends the deferrals in a row.
        deferrals=0,
        deferred_reason=None,
        job_version=version,
        lease_boot_id=None if boot_lease is None else boot_lease.boot_id,
        lease_boot_expires_ms=None if boot_lease is None else boot_lease.expires_ms,
    )


_PATCH_FIELDS = tuple(RunPatch.__dataclass_fields__)


def patched(row: RunRow, patch: RunPatch) -> RunRow:
    """``row`` as it reads once ``patch`` is written."""
    return replace(row, **{name: getattr(patch, name) for name in _PATCH_FIELDS})


def upgraded_patch(row: RunRow, cursor_json: str | None, version: int, at: str) -> RunPatch:
    """The held row as it stands, its cursor upgraded to ``version``'s format and the
    run of that version (see :mod:`jobrun._core.rules.versions`); nothing else changes,
    the lease included, and no pass is counted."""
    held = RunPatch(**{name: getattr(row, name) for name in _PATCH_FIELDS})
    return replace(held, cursor=cursor_json, job_version=version, updated_at=at)


def failed_patch(row: RunRow, reason: str, at: str) -> RunPatch:
    """A held run that ends ``failed`` now, for ``reason``, its lease given up."""
    return replace(
        unleased(row),
        status=FAILED,
        last_error=reason,
        updated_at=at,
        ended_at=at,
        deferrals=0,
        deferred_reason=None,
        error_origin=None,
    )


def pass_failure_patch(
    row: RunRow, text: str, at: str, next_attempt_at: str | None, origin: str | None = None
) -> RunPatch:
    """The row after a failed pass: one more attempt charged, retried at
    ``next_attempt_at``, or failed for good when that is ``None``.

    The cursor and counters are written back verbatim: a failed pass never
    leaks the handler's state.
    """
    exhausted = next_attempt_at is None
    return RunPatch(
        status=FAILED if exhausted else RUNNING,
        cursor=row.cursor,
        counters=row.counters,
        attempts=row.attempts + 1,
        last_error=text,
        updated_at=at,
        next_attempt_at=next_attempt_at,
        ended_at=at if exhausted else None,
        lease_takeovers=row.lease_takeovers,
        lease_epoch=row.lease_epoch,
        passes_committed=row.passes_committed,
        # A failure, retried or not, ends the deferrals in a row.
        deferrals=0,
        deferred_reason=None,
        job_version=row.job_version,
        error_origin=origin,
    )


DEFAULT_MAX_DEFERRALS = 100
"""How many passes in a row a run may defer (``RetryAfter``) before it fails."""


def deferred_patch(row: RunRow, reason: str, at: str, due_at: str) -> RunPatch:
    """The row after a pass that raised ``RetryAfter``: given back as a hand-back
    gives it (nothing committed, no attempt or takeover charged, the ledger
    kept), but due again only at ``due_at``, one more deferral counted, and its
    ``reason`` kept for the console."""
    return replace(
        unleased(row),
        updated_at=at,
        next_attempt_at=due_at,
        deferrals=row.deferrals + 1,
        deferred_reason=reason,
    )


def deferrals_exceeded_reason(deferrals: int, max_deferrals: int, reason: str) -> str:
    """``last_error`` of a run failed because it would defer once more than its limit."""
    last = f" (last reason: {reason})" if reason else ""
    return (
        f"RetryAfter: the run was deferred {deferrals} times in a row and asked to be "
        f"deferred again; the limit is {max_deferrals} (the job's max_deferrals){last}"
    )
