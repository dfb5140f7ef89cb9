"""A run's state changes, decided here once; the stores only choose rows and apply.

Every change to a run after its claim is built here, with no I/O: what an
operator's cancel, resume and release write, and the row a pass's holder writes
when the pass ends (a commit, a failure, a deferral, a hand-back;
:mod:`jobrun._core.engine.outcomes` sends those writes, fenced on the holder's
lease, and reads their answers). The claim itself, takeovers included, is
decided in :mod:`jobrun._core.leases.claims`.

The operators' changes do not depend on the row beyond its status, so each is
a :class:`RunChange`: the values to set and the condition under which they
apply, one conditional write.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from jobrun._core.leases.renewal import Lease
from jobrun._core.model.predicates import PARKED_AT, parked
from jobrun._core.model.records import BootInstant, JobRunStatus, RunPatch, RunRow

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value
DONE = JobRunStatus.DONE.value

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


_PATCH_FIELDS = tuple(RunPatch.__dataclass_fields__)


def held_patch(row: RunRow, *changes: tuple[str, Value]) -> RunPatch:
    """The row's whole mutable state as it stands, the lease included, but for
    ``changes`` (column, value): what an outcome writes of what it leaves alone."""
    state: dict[str, Any] = {name: getattr(row, name) for name in _PATCH_FIELDS}
    state.update(changes)
    return RunPatch(**state)


def unleased(row: RunRow) -> RunPatch:
    """The row's state as claimed, minus the lease: due again at once, nothing charged
    (what a release by hand writes, too)."""
    return held_patch(row, *_UNLEASED)


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


def patched(row: RunRow, patch: RunPatch) -> RunRow:
    """``row`` as it reads once ``patch`` is written."""
    return replace(row, **{name: getattr(patch, name) for name in _PATCH_FIELDS})


def upgraded_patch(row: RunRow, cursor_json: str | None, version: int, at: str) -> RunPatch:
    """The held row as it stands, its cursor upgraded to ``version``'s format and the
    run of that version (see :mod:`jobrun._core.rules.versions`); nothing else changes,
    the lease included, and no pass is counted."""
    return replace(held_patch(row), cursor=cursor_json, job_version=version, updated_at=at)


def failed_patch(row: RunRow, reason: str, at: str) -> RunPatch:
    """A held run that ends ``failed`` now, for ``reason``, its lease given up: as
    after a last failed pass, but with no attempt charged."""
    return replace(pass_failure_patch(row, reason, at, None), attempts=row.attempts)


def pass_failure_patch(
    row: RunRow, text: str, at: str, next_attempt_at: str | None, origin: str | None = None
) -> RunPatch:
    """The row after a failed pass: one more attempt charged, retried at
    ``next_attempt_at``, or failed for good when that is ``None``.

    The cursor and counters are written back verbatim: a failed pass never
    leaks the handler's state.
    """
    exhausted = next_attempt_at is None
    return replace(
        unleased(row),
        status=FAILED if exhausted else RUNNING,
        attempts=row.attempts + 1,
        last_error=text,
        updated_at=at,
        next_attempt_at=next_attempt_at,
        ended_at=at if exhausted else None,
        # A failure, retried or not, ends the deferrals in a row.
        deferrals=0,
        deferred_reason=None,
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
