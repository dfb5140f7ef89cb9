"""Pause and unpause (revision 0009): a run, every run of a job, a limit key.

A pause is not a cancel: the run stays live (a start of its key joins it), keeps
its cursor and its step ledger, and comes back where it stopped, nothing charged.

* **A run** (:func:`pause_job_run`): one conditional write. A paused run is never
  due (:func:`jobrun._core.model.predicates.is_due`), so no claim takes it; one no lease
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
  is deferred until the key is unpaused (``engine.limit_pauses.defer_for_paused_limit``), and the
  unpause makes those runs due at once.

Pausing what is paused, or unpausing what is not, changes nothing and is no error.
"""

from __future__ import annotations

from jobrun._core.limits.buckets import limit_paused_reason
from jobrun._core.model.formats import format_instant
from jobrun._core.model.names import require_name, require_text
from jobrun._core.model.predicates import is_live, is_paused, outcome_of
from jobrun._core.model.records import JobRun
from jobrun._core.model.refusals import checked_str, refuse
from jobrun._core.model.run_views import job_run_of
from jobrun._core.operator.actions import checked_run_id, stored_row
from jobrun._core.port import OperatorStore
from jobrun._core.rules.pausing import pause_transition, unpause_transition
from jobrun._core.sources import Sources
from jobrun._core.time.clock import ClockLike
from jobrun.errors import JobRunNotLiveError

_TRIES = 3


def _checked_reason(reason: object) -> str | None:
    if reason is None:
        return None
    return require_text(checked_str(reason, "reason"), "reason")


async def pause_job_run(
    sources: Sources,
    /,
    store: OperatorStore,
    run_id: str,
    *,
    reason: str | None = None,
    clock: ClockLike | None = None,
) -> JobRun:
    """Pause a running run until :func:`unpause_job_run`; returns its record.

    A paused run stays live (a start of its key joins it) but no driver claims
    it. A pass in flight stops at its next step boundary: its next step write
    tells it (at most one more step body starts, and none in a pass that writes
    no more steps, which then ends as it would), it starts no new step, commits
    nothing, is charged nothing (no attempt, no backoff, no error), keeps the
    steps that finished and gives its lease back, which also frees its limit
    slots. Not a cancel: the run keeps its cursor and ledger and goes on from
    there when unpaused. Pausing a paused run changes nothing (the first pause's
    time and reason stay); pausing a run that has ended raises
    :class:`JobRunNotLiveError`.
    """
    checked_run_id(run_id)
    reason = _checked_reason(reason)
    for _ in range(_TRIES):
        at = format_instant(sources.clock_for(clock).now())
        applied = await store.pause(run_id, pause_transition(at, reason))
        row = await stored_row(store, run_id)
        if applied or is_paused(row):
            return job_run_of(row)  # paused already: a second pause changes nothing
        if not is_live(row):
            raise JobRunNotLiveError(run_id, "paused", outcome_of(row))
        # Unpaused between the write and the read: pause it now.
    return job_run_of(row)


async def unpause_job_run(
    sources: Sources, /, store: OperatorStore, run_id: str, *, clock: ClockLike | None = None
) -> JobRun:
    """Unpause a paused run: due at once, and workers pick it up as they would a new
    run. Unpausing a running run that is not paused changes nothing; a run that has
    ended raises :class:`JobRunNotLiveError`. A run of a paused job stays unpaused
    (the job's next starts are still paused)."""
    checked_run_id(run_id)
    for _ in range(_TRIES):
        at = format_instant(sources.clock_for(clock).now())
        applied = await store.pause(run_id, unpause_transition(at))
        row = await stored_row(store, run_id)
        if not is_live(row):
            raise JobRunNotLiveError(run_id, "unpaused", outcome_of(row))
        if applied or not is_paused(row):
            return job_run_of(row)  # not paused: nothing to do
        # Paused again between the write and the read: unpause it now.
    return job_run_of(row)


def _checked_job(module_id: object, job: object) -> tuple[str, str]:
    return require_name(module_id, "module_id"), require_name(job, "job")


async def pause_job(
    sources: Sources,
    /,
    store: OperatorStore,
    *,
    module_id: str,
    job: str,
    reason: str | None = None,
    clock: ClockLike | None = None,
) -> int:
    """Pause a job, as a queue is paused: every live run of ``(module_id, job)`` is
    paused (as :func:`pause_job_run` would), and so is every run of it started
    until :func:`unpause_job`, each from its start (a start still joins a live
    run of its key). One transaction; returns how many runs it paused now. The
    pause is recorded in the database (health and the console list it); pausing
    a paused job keeps its record and pauses what is not paused yet."""
    module_id, job = _checked_job(module_id, job)
    reason = _checked_reason(reason)
    at = format_instant(sources.clock_for(clock).now())
    return await store.pause_job(module_id, job, at, reason)


async def unpause_job(
    sources: Sources,
    /,
    store: OperatorStore,
    *,
    module_id: str,
    job: str,
    clock: ClockLike | None = None,
) -> int:
    """Unpause a job: its pause record goes, and every paused run of it (whether it
    was paused with the job or on its own) is unpaused, due at once. One
    transaction; returns how many runs it unpaused."""
    module_id, job = _checked_job(module_id, job)
    at = format_instant(sources.clock_for(clock).now())
    return await store.unpause_job(module_id, job, at)


def _checked_key(key: object) -> str:
    checked = require_text(checked_str(key, "key"), "key")
    if not checked:
        raise refuse("key", "is empty", message="a limit key must not be empty")
    return checked


async def pause_limit(
    sources: Sources,
    /,
    store: OperatorStore,
    key: str,
    *,
    reason: str | None = None,
    clock: ClockLike | None = None,
) -> bool:
    """Pause a limit key (a rate limit's, or a concurrency key) on ``store``, the
    database that keeps its bucket and slots: a step that names it (``p.step(...,
    rate_limit=key)`` or ``concurrency_limit=key``) does not run; its pass ends
    deferred, nothing charged, and the run waits until :func:`unpause_limit`,
    whatever its pass budget (as for a limit cooling down beyond it). Steps
    already running go on. Returns whether the key was not paused before (pausing
    a paused key keeps the first pause)."""
    key = _checked_key(key)
    reason = _checked_reason(reason)
    at = format_instant(sources.clock_for(clock).now())
    return await store.pause_limit(key, at, reason)


async def unpause_limit(sources: Sources, /, store: OperatorStore, key: str) -> int:
    """Unpause a limit key: the runs its pause deferred are due at once; returns how
    many. Unpausing a key that is not paused changes nothing (returns 0)."""
    del sources  # bound like the other operations; an unpause reads no clock
    key = _checked_key(key)
    return await store.unpause_limit(key, limit_paused_reason(key))
