"""Claims and takeovers: which run a claim gets, and what it writes.

A claim leases one run right before its pass. Which run it gets
(:func:`claim_candidate`: an orphan first, else the next due run among the jobs
below their limits) and what its write sets (:func:`claim_transition`: a fresh
lease and a raised fencing epoch and, when another holder's lease was still on
the run, the takeover counted with the text users see in ``last_error``) are
decided here once, with no I/O.

A claim's new state depends on the row it found, so a store reads the chosen
row, asks :func:`claim_transition`, and writes the answer fenced on every value
the decision read (:data:`CLAIM_FIELDS`, a compare-and-set): if the row changed
in between, the write applies to nothing and the store looks again. The SQL
twins, for the stores that decide in the database, are in
``jobrun/sql/statements/claims.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from jobrun._core.model.predicates import (
    boot_held,
    due_at,
    is_due,
    is_leased,
    is_live,
    is_paused,
    runnable_by,
)
from jobrun._core.model.records import BootInstant, ClaimRequest, RunRow

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


def in_flight(
    rows: Iterable[RunRow], now_at: str, boot: BootInstant | None = None
) -> dict[tuple[str, str], int]:
    """Per job, its leased runs (:func:`~jobrun._core.model.predicates.is_leased`), and
    the live ones still held on ``boot``'s clock (after a forward wall-clock step their
    wall expiry only looks past: see :func:`~jobrun._core.model.predicates.boot_held`)."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        if is_leased(row, now_at) or (is_live(row) and boot_held(row, boot)):
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
    leased = in_flight(rows, request.now_at, request.boot)
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
