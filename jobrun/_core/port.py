"""The store port: the operations a backend supplies, and their contract.

The pass engine and the driver speak only to this protocol. ``SqlJobRunStore``
implements it for SQLite and Postgres; ``jobrun.testing.MemoryJobRunStore`` for
tests. A store raises :class:`jobrun.errors.StoreError` (original as
``__cause__``) when its backend fails, and nothing else for backend trouble.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from jobrun._core.leases.claims import Claimed
from jobrun._core.leases.owed_releases import OwedReleases
from jobrun._core.leases.proof_of_death import OrphanScans
from jobrun._core.limits.buckets import LimitUsage
from jobrun._core.model.queue_safety import DEFAULT_MAX_PAYLOAD_BYTES
from jobrun._core.model.records import (
    BootInstant,
    BootLease,
    ClaimRequest,
    HealthCounts,
    HeldLease,
    PauseRecord,
    RunFilter,
    RunPatch,
    RunRow,
    ScheduleRow,
    StepRow,
)
from jobrun._core.model.refusals import checked_positive_int
from jobrun._core.model.worker_rows import WorkerRow
from jobrun._core.rules.fair_turns import ClaimTurns
from jobrun._core.rules.transitions import RunChange

DEFAULT_MAX_STEP_RESULT_BYTES = 1024 * 1024


WRITTEN_PAUSED = 2
"""What :meth:`JobRunStore.record_step` and :meth:`JobRunStore.commit_pass` return when
their write applied and the run is paused (revision 0009): a true value, told from
``True`` (written, not paused) and ``False`` (refused, nothing written). The pass
learns of a pause from its own writes, at no extra round trip."""


def not_watching() -> None:
    """What ``watch_presence`` returns where there is nothing to stop watching."""
    return None


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Size caps, in bytes of UTF-8 JSON text, enforced before anything is written."""

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_cursor_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_step_result_bytes: int = DEFAULT_MAX_STEP_RESULT_BYTES
    max_counters_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        names = ("max_payload_bytes", "max_cursor_bytes", "max_step_result_bytes")
        for name in (*names, "max_counters_bytes"):
            checked_positive_int(getattr(self, name), name)


class KeptForDrives:
    """What a store keeps for every drive of its database: the first properties of
    :class:`JobRunStore`, held alike by every store, whose constructor calls
    ``KeptForDrives.__init__``."""

    def __init__(self, limits: StoreLimits, default_scope: object) -> None:
        self._limits = limits
        self._default_scope = default_scope
        self._owed_releases = OwedReleases()
        self._claim_turns = ClaimTurns()
        self._orphan_scans = OrphanScans()

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._default_scope

    @property
    def owed_releases(self) -> OwedReleases:
        return self._owed_releases

    @property
    def claim_turns(self) -> ClaimTurns:
        return self._claim_turns

    @property
    def orphan_scans(self) -> OrphanScans:
        return self._orphan_scans

    @property
    def stranded_scans(self) -> OrphanScans:
        """Deprecated alias of :attr:`orphan_scans` (removed in the next release)."""
        warnings.warn(
            "stranded_scans is deprecated: use orphan_scans (stranded now means only "
            "'leased, lease expired')",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._orphan_scans


class JobRunStore(Protocol):
    """Durable storage for runs and the step ledger of the pass in flight."""

    @property
    def limits(self) -> StoreLimits:
        """The size caps callers must enforce before writing."""
        ...

    @property
    def default_scope(self) -> object:
        """What ``await p.scope()`` returns when the host supplies no ``open_scope``."""
        ...

    @property
    def owed_releases(self) -> OwedReleases:
        """Lease releases this store failed to write, sent again before the next
        claim (see ``jobrun._core.leases.owed_releases``); the store only keeps them."""
        ...

    @property
    def claim_turns(self) -> ClaimTurns:
        """Which claims of :func:`jobrun.run_due_jobs` calls on this store go by age
        (see ``jobrun._core.rules.fair_turns``), counted across calls; the store only keeps it."""
        ...

    @property
    def orphan_scans(self) -> OrphanScans:
        """What the scans for runs of dead holders saw on this store, kept between
        drives (see ``jobrun._core.leases.proof_of_death``); the store only keeps it."""
        ...

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        """Atomically insert ``row`` unless a ``running`` row has the same key.

        Returns ``(row, True)`` when inserted, else ``(live_row, False)`` with the
        live row unchanged. Atomic across connections, processes and hosts: two
        callers can never both insert a live row for one key. A run that is done
        or failed never blocks a new one.
        """
        ...

    async def start_many(
        self, rows: Sequence[RunRow], *, connection: object | None = None
    ) -> list[tuple[RunRow, bool]]:
        """:meth:`start_or_join` for each of ``rows`` (no two of one key), atomically as
        a whole: ``(row, True)`` or ``(live_row, False)`` for each, in order.

        Costs a fixed number of statements whatever the number of rows. With
        ``connection`` (a SQL store's: the caller's SQLAlchemy ``AsyncConnection``
        in an open transaction), the rows are written in that transaction and exist
        only if it commits; a store that cannot use it refuses it.
        """
        ...

    async def get(self, run_id: str) -> RunRow | None:
        """One run by id, whatever its status; ``None`` when absent."""
        ...

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        """Lease the run that became due first, among the requested jobs; ``None`` if none.

        Due means ``running`` with ``COALESCE(next_attempt_at, started_at) <=
        now_at``; order is ``priority`` (highest first), then that instant, then
        id (:func:`jobrun._core.leases.claims.claim_candidate` spells the rules).
        A job in ``max_concurrent`` is passed over while that many of its runs
        hold a lease that has not expired; the count and the lease are one
        atomic decision, so concurrent claimers on any number of hosts never
        lease more than the limit. A run still held by a token in
        ``dead_owners`` (its holder was proven dead) is claimed first, due or
        not, outside the limits.

        The store decides nothing about the run's new state: it writes what
        :func:`jobrun._core.leases.claims.claim_transition` makes of the row it
        chose, fenced on the values that decision read, so concurrent claimers
        never get the same run. Returns that decision: the row as written and
        the holder taken over, if any.
        """
        ...

    async def claim_batch(self, request: ClaimRequest, tokens: Sequence[str]) -> list[Claimed]:
        """Up to ``len(tokens)`` runs, as :meth:`claim` would lease them one after
        another (orphans first, then due runs in claim order, each limit counting
        the runs the batch already took), the i-th under ``tokens[i]`` (each its own
        lease; ``request.token`` is not used). In claim order; fewer (or none) when
        fewer fit. On Postgres one statement that passes over runs another claimer
        has locked instead of waiting for them."""
        ...

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> list[HeldLease]:
        """Running runs held by a lease that has not expired by ``now_at``, of ``jobs``
        (``(module_id, job)`` pairs; ``None``: every job), with what the backend
        knows of each holder's presence."""
        ...

    async def presence(self) -> int | None:
        """This process's presence in the database, established at the first call:
        a key the database frees by itself when the process dies. ``None`` where
        the backend has no such thing (SQLite, memory)."""
        ...

    def watch_presence(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        """Call ``lost`` once, soon after this process's presence ``key`` is lost
        (its liveness check failed: the session ended or stopped answering), or at
        once if ``key`` is not the live presence now. Returns what stops the
        watching. Where there is no presence (``key`` is ``None``; SQLite, memory)
        nothing is ever called. No I/O: the presence checks itself."""
        ...

    def presence_fd(self, key: int | None) -> int | None:
        """The socket of the connection that holds presence ``key``, for the
        watchdog to see the server close it while the event loop is blocked;
        ``None`` where there is none (or ``key`` is not the live presence). No I/O."""
        ...

    async def clock_offset_s(self) -> float:
        """How far the database's clock is ahead of this host's system clock, in
        seconds; ``0.0`` where both are one clock (SQLite, memory)."""
        ...

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        """Rows equal to every given filter field, newest id first, ``limit`` at most."""
        ...

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        """Write every field of ``patch`` (a failed pass); the ledger stays.

        Fenced: applies only while the run is ``running`` and ``lease_owner``
        is ``token``. Returns whether it applied. A paused run the patch leaves
        without a lease waits at ``PARKED_AT``, whatever due instant the patch
        gives (:func:`jobrun._core.model.predicates.parked`): it was paused while its
        pass ran.
        """
        ...

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> int:
        """Write ``patch`` AND delete the run's whole ledger, in one transaction;
        :data:`WRITTEN_PAUSED` when it applied to a paused run (see :meth:`patch`).

        Fenced like :meth:`patch`; when the fence refuses, the ledger (which now
        belongs to whoever holds the run) is left alone. If the write and the
        drop could come apart, a step name reused by the next pass would find
        the previous pass's memo and skip work it never did.
        """
        ...

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        """The run's whole ledger (one pass's steps at most), by step name."""
        ...

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> int:
        """Insert or overwrite one ledger row; durable when this returns a true value:
        ``True``, or :data:`WRITTEN_PAUSED` when the run is paused (read in the same
        statement; the pass then starts no new step).

        Fenced like :meth:`patch`, atomically with the write (a concurrent claim
        cannot slip between the check and the write). Called once per finished
        step attempt, before the next step starts, so a kill loses at most the
        step in flight.
        """
        ...

    async def extend_lease(
        self,
        run_id: str,
        token: str,
        expires_at: str,
        now_at: str,
        boot: BootLease | None = None,
    ) -> bool:
        """Move a held lease's expiry to ``expires_at`` (and, with ``boot``, its expiry
        on the boot clock; a store with a clock of its own ignores it); ``False`` when
        the lease is no longer ``token``'s, or has expired by ``now_at``: an expired
        lease is never renewed back to life (another run of a limited job may have
        been leased in its place, and a claimer may be taking this one over)."""
        ...

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        """Reserve the next token of rate limit ``key``; the seconds until it is the
        caller's (``0.0``: now; ``math.inf`` while ``key`` is paused, read in the
        same statement: the token is then given back, see :meth:`give_back_token`).

        The bucket (created full at the first take) holds ``burst`` tokens at most
        and refills at ``per_second`` on the DATABASE's clock, read inside the one
        atomic write that refills and takes (never a caller's clock), so takers on
        any number of hosts, whatever their clocks, are never issued more than
        ``burst + per_second * t`` tokens due within any ``t`` seconds. Refill counts
        whole milli-tokens (:func:`jobrun._core.limits.declarations.refilled`). Every take
        reserves: below zero the bucket queues takers in the order they asked,
        each told how long until its token refills. ``per_second`` and ``burst``
        are the caller's declaration, stored with the bucket for health.
        """
        ...

    async def limit_paused(self, key: str) -> bool:
        """Whether limit key ``key`` is paused (:func:`jobrun.pause_limit`). Read only
        when a step's limit could not be had at once (a token's wait is infinite,
        or a concurrency slot was refused)."""
        ...

    async def unpark(self, run_id: str, reason: str) -> bool:
        """Make run ``run_id`` due at once if it still waits at ``PARKED_AT`` for the
        paused limit its ``deferred_reason`` (``reason``) names, no lease and no pause
        of its own on it; whether it did. The end of a pass deferred by a paused limit
        that was unpaused meanwhile (see :mod:`jobrun._core.engine.limit_pauses`)."""
        ...

    async def give_back_token(self, key: str, burst: int) -> None:
        """Return a token reserved by :meth:`take_token` that will not be used (a
        wait too long for the pass): one token more, ``burst`` at most."""
        ...

    async def acquire_slot(
        self,
        key: str,
        most: int,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> bool:
        """Take a slot of concurrency key ``key`` for step ``step`` of run ``run_id``
        under lease ``token`` if fewer than ``most`` slots of ``key`` count now;
        whether it was taken.

        A slot counts while its token is still its run's lease and that lease has
        not expired by ``now_at``, or is still held on ``boot``'s clock
        (:func:`jobrun._core.model.predicates.slot_counts`): a holder that died,
        lost its lease or ended its pass frees its slots with no write. ``now_at``
        is judged as a claim judges expiries (a wall-clock step frees no slot); on
        Postgres, when the taker's lease was written on the database's clock, that
        clock judges instead. The count and the insert are one atomic decision across
        connections, processes and hosts. None is taken while ``key`` is paused
        (:meth:`limit_paused` tells that refusal from a full limit's)."""
        ...

    async def release_slot(
        self,
        key: str,
        run_id: str,
        step: str,
        token: str,
        now_at: str,
        boot: BootInstant | None = None,
    ) -> None:
        """Let go of the slot :meth:`acquire_slot` took; slots of ``key`` that no
        longer count by ``now_at`` (and ``boot``, as there) are deleted on the way
        (nothing else cleans them)."""
        ...


class OperatorStore(JobRunStore, Protocol):
    """What operators do by hand. Every action is conditional on the run's status."""

    async def health(self, now_at: str) -> HealthCounts:
        """Counts of running, due, leased and failed runs, and the due instant of
        the run that has waited longest. Due means due by ``now_at`` and either
        not leased or leased under an expired lease (whose expiry is then its
        due instant); leased means held by a lease that has not expired."""
        ...

    async def cool_limit(
        self, key: str, per_second: float, burst: int, seconds: float, reason: str
    ) -> None:
        """Hold rate limit ``key``'s bucket for ``seconds`` on the DATABASE's clock
        (``RetryAfter(rate_limit=key)``): no token is due before then for any
        taker; the first taker after it gets one then, the rest follow at the
        rate. A longer cooling down already set is kept. ``reason`` is shown by
        health until it ends."""
        ...

    async def limit_usage(self, now_at: str) -> LimitUsage:
        """Every rate-limit bucket as it stands on the database's clock now (rate,
        burst, tokens, takers waiting), and the slots that count at ``now_at`` per
        concurrency key."""
        ...

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        """Due runs (not leased, due by ``now_at``) per ``(module_id, job)``.

        A separate read, never part of the claim: the claim asks only for the
        driver's own jobs, so runs of a job nobody registers are seen only here.
        """
        ...

    async def versions_by_job(self) -> dict[tuple[str, str], dict[int, int]]:
        """Running runs per ``(module_id, job)`` and per stored version
        (:func:`jobrun._core.model.predicates.stored_version`): ``{job: {version: runs}}``.
        Jobs without running runs are left out."""
        ...

    async def cancel(self, run_id: str, change: RunChange) -> bool:
        """Apply ``change`` (:func:`jobrun._core.rules.transitions.cancel_transition`) in one
        conditional write; ``False`` when its condition does not hold. The ledger
        is kept."""
        ...

    async def resume(self, run_id: str, change: RunChange) -> bool:
        """Apply ``change`` (:func:`jobrun._core.rules.transitions.resume_transition`) and, in
        the same transaction, give the run's failed ledger rows their attempts
        back (completed ones are kept: they are not repeated).

        Raises :class:`jobrun.errors.JobConflictError` when another live run holds
        the key. ``False`` when the change's condition does not hold.
        """
        ...

    async def release(self, run_id: str, change: RunChange) -> bool:
        """Apply ``change`` (:func:`jobrun._core.rules.transitions.release_transition`) in one
        conditional write; ``False`` when no lease was held."""
        ...

    async def pause(self, run_id: str, change: RunChange) -> bool:
        """Apply ``change`` (:func:`jobrun._core.rules.pausing.pause_transition` or
        ``unpause_transition``) in one conditional write; ``False`` when its condition
        does not hold. The due instant follows the pause (``RunChange.applied``)."""
        ...

    async def pause_job(self, module_id: str, job: str, at: str, reason: str | None) -> int:
        """Record the job as paused (kept as it is when it already was) and pause its
        live runs that are not paused yet (``paused_at`` ``at``, the record's reason),
        in one transaction; how many runs it paused. A run of the job started after
        this commits starts paused."""
        ...

    async def unpause_job(self, module_id: str, job: str, at: str) -> int:
        """Delete the job's pause record and unpause its paused runs, in one
        transaction; how many runs it unpaused (each due at once, unless leased)."""
        ...

    async def pause_limit(self, key: str, at: str, reason: str | None) -> bool:
        """Record limit key ``key`` as paused; ``False`` when it already was (kept as it is)."""
        ...

    async def unpause_limit(self, key: str, reason: str) -> int:
        """Delete ``key``'s pause record, then make due at once every run that waits at
        ``PARKED_AT`` with ``deferred_reason`` ``reason`` (deferred by the pause);
        how many."""
        ...

    async def pauses(self) -> tuple[dict[tuple[str, str], PauseRecord], dict[str, PauseRecord]]:
        """The paused jobs and the paused limit keys, each with its record."""
        ...

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        """Delete finished runs (and their ledgers) that ended before ``ended_before``.

        Only the given statuses, never ``running``; in transactions of at most
        ``batch_size`` runs. ``only_jobs`` (when given) limits it to runs of
        those ``(module_id, job)`` pairs; runs of ``except_jobs`` are kept.
        Returns how many runs were deleted.
        """
        ...

    async def record_retention(
        self, keep_for_s: Mapping[tuple[str, str], int | None], at: str
    ) -> None:
        """Record each ``(module_id, job)``'s own retention (its ``keep_for``) in whole
        seconds (``updated_at`` ``at``), replacing what was recorded; ``None`` deletes
        the job's record. One transaction. Read by workers that do not register the
        job (see :mod:`jobrun._core.operator.retention`)."""
        ...

    async def recorded_retention(self) -> dict[tuple[str, str], int]:
        """Every recorded retention, in seconds, whichever registry recorded it."""
        ...

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        """Write the worker's row (``row.id`` its key): inserted if absent, else its
        ``jobs``, ``heartbeat_at`` and ``expires_at`` replaced. With ``sweep_at``,
        also delete the rows of workers gone by then (``expires_at`` not after it;
        see :mod:`jobrun._core.operator.worker_registry`)."""
        ...

    async def forget_worker(self, worker_id: str) -> None:
        """Delete the worker's row (it stopped); a missing one is no error."""
        ...

    async def live_workers(self, now_at: str) -> list[WorkerRow]:
        """The rows of workers live at ``now_at`` (expiring after it), oldest first."""
        ...


class ScheduleStore(JobRunStore, Protocol):
    """Where each schedule's progress is kept, so a slot is started once across hosts."""

    async def schedule_rows(self) -> list[ScheduleRow]:
        """Every schedule's row, whichever registry wrote it."""
        ...

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        """Insert each row whose key has none yet; existing rows are left as they are."""
        ...

    async def reset_schedule(self, schedule: ScheduleRow, stored_cron: str | None) -> bool:
        """Make the stored row of ``schedule``'s key ``schedule`` (a new cron, counted from
        its ``last_slot_at``) only if its cron is still ``stored_cron`` (``None``
        matches a NULL cron), in one conditional write; whether it was written. Of
        callers who read the same row, one at most resets it."""
        ...

    async def remove_schedules(self, keys: Sequence[tuple[str, str, str]]) -> None:
        """Delete the rows of these ``(module_id, job, schedule)`` keys; a missing one is
        no error."""
        ...

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        """Take a slot and start its run, atomically; ``None`` when the slot was not free.

        ``schedule.last_slot_at`` is the slot. When the stored row of the same key
        has the same ``cron`` and an earlier ``last_slot_at``, it becomes
        ``schedule`` (its ``last_run_id`` the run's id) and ``row`` is started as
        by :meth:`start_or_join` (joining a live run of its key: then the live run
        is returned, with ``False``, and becomes ``last_run_id``), in one
        transaction. Otherwise (another caller took this slot or a later one, the
        row counts another cron's slots, or the schedule has no row) nothing is
        written. Of any number of callers on any number of hosts, one at most
        gets a slot, even after its run ended.
        """
        ...
