"""Pause and unpause (revision 0009): a run, every run of a job, a limit key.

A pause is not a cancel: the run stays live (a start of its key joins it), keeps
its cursor and its step ledger, and comes back where it stopped, nothing charged.

* **A run** (:func:`pause_job_run`): one conditional write. A paused run is never
  due (:func:`jobrun._core.predicates.is_due`), so no claim takes it; one no lease
  holds waits at ``PARKED_AT``, out of every clock's reach, so the due reads pass
  over it by their index range. A pass in flight is told by its own writes: the
  step write (and the commit) returns the run's pause in the same statement
  (``port.WRITTEN_PAUSED``), and the pass then starts no new step: it ends with
  nothing committed or charged, its finished steps kept, its lease handed back
  (which lets go of its limit slots); the hand-back parks the run. Unpausing
  makes it due at once (its lease, if a pass still holds it, is left alone).
* **A job** (:func:`pause_job`): a record of its own, written with the pause of
  every live run of the job in one transaction; a run started while the record
  exists starts paused (the start reads it in its own statement). Unpausing the
  job deletes the record and unpauses every paused run of the job.
* **A limit key** (:func:`pause_limit`): a record read by the statements that
  take a token (its wait is then infinite) or a slot (refused); the step's pass
  is deferred until the key is unpaused (:func:`defer_for_paused_limit`), and the
  unpause makes those runs due at once.

Pausing what is paused, or unpausing what is not, changes nothing and is no error.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import timedelta

from jobrun._core.clock import Clock, ClockLike
from jobrun._core.formats import format_instant, parse_instant
from jobrun._core.lease import Lease
from jobrun._core.limits import limit_paused_reason
from jobrun._core.names import require_name, require_text
from jobrun._core.outcomes import PassOutcome, _release_write
from jobrun._core.port import JobRunStore, OperatorStore
from jobrun._core.predicates import PARKED_AT, is_live, is_paused, outcome_of, parked
from jobrun._core.records import JobRun, PauseRecord, RunRow, job_run_of
from jobrun._core.refusals import checked_str, refuse
from jobrun._core.sources import Sources
from jobrun._core.transitions import RUNNING, RunChange, unleased
from jobrun.errors import (
    JobRunNotFoundError,
    JobRunNotLiveError,
    RetryAfter,
    StoreError,
    describe_exception,
)

LIMIT_PAUSE_RECHECK_S = 60.0
"""How long a pass deferred by a paused limit waits before it looks again, when the
limit is kept in another store than the run (``registry.rate_limit(..., store=)``):
that store's unpause cannot wake the run. Otherwise the run waits for the unpause."""

_TRIES = 3


def pause_transition(at: str, reason: str | None) -> RunChange:
    """A live run that is not paused is paused at ``at`` for ``reason``; left without a
    lease, it waits at ``PARKED_AT`` (``RunChange.applied``)."""
    values = (("paused_at", at), ("pause_reason", reason), ("updated_at", at))
    return RunChange(RUNNING, values, paused=False)


def unpause_transition(at: str) -> RunChange:
    """A paused live run is unpaused at ``at``: due at once unless a lease holds it."""
    values = (("paused_at", None), ("pause_reason", None), ("updated_at", at))
    return RunChange(RUNNING, values, paused=True)


def paused_start(row: RunRow, paused_at: str, reason: str | None) -> RunRow:
    """A fresh run started while its job is paused: paused since ``paused_at``."""
    return parked(replace(row, paused_at=paused_at, pause_reason=reason))


def pause_record(paused_at: str, reason: str | None) -> PauseRecord:
    """A job's or a limit key's pause as stored (instant text), for readers."""
    return PauseRecord(parse_instant(paused_at), reason)


class LimitPausedDeferral(RetryAfter):
    """A step named a paused limit key: its pass ends deferred until the key is
    unpaused (``until_unpaused``: the limit lives in the run's own store), else for
    :data:`LIMIT_PAUSE_RECHECK_S`. Nothing is charged, not even a deferral."""

    def __init__(self, key: str, until_unpaused: bool) -> None:
        super().__init__(LIMIT_PAUSE_RECHECK_S, reason=limit_paused_reason(key))
        self.key = key
        self.until_unpaused = until_unpaused


async def defer_for_paused_limit(
    store: JobRunStore, clock: Clock, row: RunRow, lease: Lease, deferral: LimitPausedDeferral
) -> PassOutcome:
    """End a pass whose step named a paused limit: the lease given back, nothing
    committed or charged (the deferrals in a row are not counted), the run waiting
    at ``PARKED_AT`` until the unpause makes it due (or looking again later).

    The unpause may land between the step's look at the key and this write, and
    then it would not find the run: so the key is looked at again after the write,
    and if it is no longer paused the run makes itself due. Either that look sees
    the pause, and the unpause (later) finds the run, or it does not, and the run
    goes on its own."""
    now = clock.now()
    waits_at = PARKED_AT
    if not deferral.until_unpaused:
        waits_at = format_instant(now + timedelta(seconds=LIMIT_PAUSE_RECHECK_S))
    patch = replace(
        unleased(row),
        updated_at=format_instant(now),
        next_attempt_at=waits_at,
        deferred_reason=deferral.reason,
    )
    if not await _release_write(store, row.id, patch, lease):
        return PassOutcome("superseded")
    if deferral.until_unpaused:
        still = True
        with contextlib.suppress(StoreError):
            still = False
            still = await store.limit_paused(deferral.key)
        if not still:
            with contextlib.suppress(StoreError):
                await store.unpark(row.id, deferral.reason)
    return PassOutcome("deferred", describe_exception(deferral))


# -- the operator's side -------------------------------------------------------------------


def _checked_reason(reason: object) -> str | None:
    if reason is None:
        return None
    return require_text(checked_str(reason, "reason"), "reason")


def _check_id(run_id: object) -> str:
    return require_text(checked_str(run_id, "run_id"), "run_id")


async def _row(store: OperatorStore, run_id: str) -> RunRow:
    row = await store.get(run_id)
    if row is None:
        raise JobRunNotFoundError(run_id)
    return row


async def pause_job_run(
    store: OperatorStore,
    run_id: str,
    *,
    reason: str | None = None,
    clock: ClockLike | None = None,
    sources: Sources,
) -> JobRun:
    """:func:`jobrun.pause_job_run`, handed its sources (the system clock)."""
    _check_id(run_id)
    reason = _checked_reason(reason)
    for _ in range(_TRIES):
        at = format_instant(sources.clock_for(clock).now())
        applied = await store.pause(run_id, pause_transition(at, reason))
        row = await _row(store, run_id)
        if applied or is_paused(row):
            return job_run_of(row)  # paused already: a second pause changes nothing
        if not is_live(row):
            raise JobRunNotLiveError(run_id, "paused", outcome_of(row))
        # Unpaused between the write and the read: pause it now.
    return job_run_of(row)


async def unpause_job_run(
    store: OperatorStore, run_id: str, *, clock: ClockLike | None = None, sources: Sources
) -> JobRun:
    """:func:`jobrun.unpause_job_run`, handed its sources (the system clock)."""
    _check_id(run_id)
    for _ in range(_TRIES):
        at = format_instant(sources.clock_for(clock).now())
        applied = await store.pause(run_id, unpause_transition(at))
        row = await _row(store, run_id)
        if not is_live(row):
            raise JobRunNotLiveError(run_id, "unpaused", outcome_of(row))
        if applied or not is_paused(row):
            return job_run_of(row)  # not paused: nothing to do
        # Paused again between the write and the read: unpause it now.
    return job_run_of(row)


def _checked_job(module_id: object, job: object) -> tuple[str, str]:
    return require_name(module_id, "module_id"), require_name(job, "job")


async def pause_job(
    store: OperatorStore,
    *,
    module_id: str,
    job: str,
    reason: str | None = None,
    clock: ClockLike | None = None,
    sources: Sources,
) -> int:
    """:func:`jobrun.pause_job`, handed its sources (the system clock)."""
    module_id, job = _checked_job(module_id, job)
    reason = _checked_reason(reason)
    at = format_instant(sources.clock_for(clock).now())
    return await store.pause_job(module_id, job, at, reason)


async def unpause_job(
    store: OperatorStore,
    *,
    module_id: str,
    job: str,
    clock: ClockLike | None = None,
    sources: Sources,
) -> int:
    """:func:`jobrun.unpause_job`, handed its sources (the system clock)."""
    module_id, job = _checked_job(module_id, job)
    at = format_instant(sources.clock_for(clock).now())
    return await store.unpause_job(module_id, job, at)


def _checked_key(key: object) -> str:
    checked = require_text(checked_str(key, "key"), "key")
    if not checked:
        raise refuse("key", "is empty", message="a limit key must not be empty")
    return checked


async def pause_limit(
    store: OperatorStore,
    key: str,
    *,
    reason: str | None = None,
    clock: ClockLike | None = None,
    sources: Sources,
) -> bool:
    """:func:`jobrun.pause_limit`, handed its sources (the system clock)."""
    key = _checked_key(key)
    reason = _checked_reason(reason)
    at = format_instant(sources.clock_for(clock).now())
    return await store.pause_limit(key, at, reason)


async def unpause_limit(store: OperatorStore, key: str) -> int:
    """:func:`jobrun.unpause_limit`."""
    key = _checked_key(key)
    return await store.unpause_limit(key, limit_paused_reason(key))
