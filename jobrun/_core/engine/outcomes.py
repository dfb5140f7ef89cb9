"""How a pass ends: the one write its holder sends last, and what the answer means.

A pass ends in exactly one of these writes, each fenced on the pass's lease
token (the rows they write are built in :mod:`jobrun._core.rules.transitions`):

* :func:`commit`: the handler's cursor and counters, and the ledger's drop;
  with the lease handed on to this driver's next pass, or given up;
* :func:`record_failure`: one attempt charged, retried after a backoff or
  failed for good, the lease given up;
* :func:`fail_run`: the run failed without a pass, for a reason the driver found;
* :func:`defer`: the handler raised ``RetryAfter``: the lease given up, nothing
  committed or charged, the run due again after the delay it asked for (or
  failed, past its job's ``max_deferrals``);
* :func:`hand_back`: the lease given up and nothing else (a pass interrupted,
  a drive asked to stop between passes, a pass that found its run paused: see
  :mod:`jobrun._core.operator.pausing`).

A write that misses (another holder, an operator) makes the outcome
``superseded``. A release the store fails is owed (see ``jobrun._core.leases.owed_releases``)
and sent again before the driver's next claim on the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Literal

from jobrun._core.leases.claims import takeovers_exceeded_reason
from jobrun._core.leases.renewal import CALL_FLOOR_S, Lease
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import RunPatch, RunRow
from jobrun._core.model.results import KEEP_CURSOR, counters_text, cursor_text, interpret_result
from jobrun._core.port import WRITTEN_PAUSED, JobRunStore
from jobrun._core.rules.retry import RetryPolicy
from jobrun._core.rules.transitions import (
    committed_patch,
    deferrals_exceeded_reason,
    deferred_patch,
    failed_patch,
    pass_failure_patch,
    patched,
    unleased,
)
from jobrun._core.time.clock import Clock
from jobrun._core.time.wall_steps import boot_instant, lease_instants
from jobrun.errors import (
    HandlerMistakeError,
    RetryAfter,
    StepFailedError,
    StepReusedError,
    describe_exception,
    exception_origin,
    printable_text,
)

MAX_ERROR_TEXT_BYTES = 8 * 1024


@dataclass(frozen=True, slots=True)
class PassOutcome:
    status: Literal[
        "advanced", "completed", "retrying", "failed", "superseded", "deferred", "paused"
    ]
    error: str | None = None
    # After an advancing commit that kept the lease: the row as now stored, so
    # the next pass needs no read, and when the commit that wrote its lease was
    # sent (the pass clock's monotonic seconds: where its self-fence starts).
    row: RunRow | None = None
    leased_at_s: float | None = None
    # A KeyboardInterrupt or SystemExit user code raised, recorded as this
    # failure: the driver raises it again unless told to go on.
    raised: KeyboardInterrupt | SystemExit | None = None
    # When a retrying or deferred run is due again (stored text), for the pass's
    # observers.
    next_attempt_at: str | None = None


def cap_error_text(text: str) -> str:
    """Cut a stored error text to 8 KiB of UTF-8, saying that it was cut.

    A NUL (which Postgres text cannot hold) and a lone surrogate (which UTF-8
    cannot encode) are shown escaped, so an exception message can never make
    the failure record itself fail.
    """
    text = printable_text(text)
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_ERROR_TEXT_BYTES:
        return text
    kept = encoded[: MAX_ERROR_TEXT_BYTES - 64].decode("utf-8", errors="ignore")
    return f"{kept} [... cut, {len(encoded) - len(kept.encode('utf-8'))} more bytes]"


async def commit(
    store: JobRunStore,
    clock: Clock,
    row: RunRow,
    lease: Lease,
    result: object,
    counters: Mapping[str, int | float],
    successor_token: Callable[[], str] | None,
    version: int = 1,
) -> PassOutcome:
    """Commit what the handler returned: cursor, counters and the ledger's drop, one write.

    With ``successor_token`` (a fresh token's source) a run that is not done
    keeps its lease for this driver's next pass, under a new token. The run is
    then of ``version``, the version of the job's code that ran the pass.
    """
    cursor_json, counters_json, done = _stored_result(store, row, result, counters)
    # The run's stamps on the wall clock; the successor lease's expiry on the instant
    # every expiry is written on (wallsteps): after a backward step the raw wall clock
    # would hand on a lease that a driver not yet stepped sees as long expired.
    _judged, written = lease_instants(clock, lease.lease_ms / 500)
    at = format_instant(clock.now())
    # The successor lease expires counted from here: its self-fence starts here.
    leased_at_s = clock.monotonic()
    boot = boot_instant(clock)
    # A lease handed on gets a fresh token. Should this commit land unseen (its
    # reply lost, or the pass interrupted while awaiting it), the failure record
    # or hand-back this pass writes next, fenced on the old token, then misses
    # and can never write the pre-commit state over the commit.
    successor = None
    if successor_token is not None and not done:
        successor = replace(lease, token=successor_token())
    patch = committed_patch(
        row,
        cursor_json,
        counters_json,
        done,
        at,
        lease,
        successor,
        version,
        expires_from=format_instant(written),
        boot=boot,
    )
    committed = patched(row, patch)
    applied = await _sent_commit(store, row, lease, patch, committed, successor)
    if not applied:
        return PassOutcome("superseded")
    if applied == WRITTEN_PAUSED and successor is not None:
        # Paused while the pass ran: no next pass; the lease it was handed goes back
        # (and that write parks the run until its unpause).
        await hand_back(store, committed, successor)
        return PassOutcome("advanced")
    return PassOutcome("completed" if done else "advanced", row=committed, leased_at_s=leased_at_s)


async def _sent_commit(
    store: JobRunStore,
    row: RunRow,
    lease: Lease,
    patch: RunPatch,
    committed: RunRow,
    successor: Lease | None,
) -> int:
    """The commit's write, fenced on ``lease``; what the store answered."""
    try:
        return await store.commit_pass(row.id, patch, lease.token)
    except BaseException:
        if successor is not None:
            # Interrupted unanswered, the commit may still reach the database later
            # (sent, not yet run there). The old lease goes back first, then the one
            # the commit hands on: landing before both, the commit is undone by the
            # second; between them or after, it misses (its fence, the old token, is
            # gone). The other order leaves the successor's lease held when the commit
            # lands between the two.
            await hand_back(store, row, lease, (committed, successor))
        raise


def _stored_result(
    store: JobRunStore, row: RunRow, result: object, counters: Mapping[str, int | float]
) -> tuple[str | None, str, bool]:
    """The handler's result as stored: the cursor's text (the run's own when it keeps
    its cursor), the counters' text, and whether the run is done."""
    next_cursor, done = interpret_result(result)
    if next_cursor is KEEP_CURSOR:
        cursor_json = row.cursor
    else:
        cursor_json = cursor_text(next_cursor, store.limits.max_cursor_bytes)
    return cursor_json, counters_text(counters, store.limits.max_counters_bytes), done


async def hand_back(
    store: JobRunStore, row: RunRow, lease: Lease, *then: tuple[RunRow, Lease]
) -> None:
    """Give a held lease back (fenced), shielded from a cancellation in progress;
    then each of ``then`` (other leases of the same run), one after the other.

    Never raises for a store failure: the hand-back is then owed (see
    ``jobrun._core.leases.owed_releases``) and sent again before the next claim on the store.
    Nor does it wait on a store that does not answer: abandoned after a renewal
    interval, at least ``CALL_FLOOR_S`` (real time), it is owed too. One shielded
    task sends them all, so a second cancellation cannot stop the later ones.
    """
    await asyncio.shield(_handing_back(store, ((row, lease), *then)))


async def _handing_back(store: JobRunStore, held: tuple[tuple[RunRow, Lease], ...]) -> None:
    # Each write's coroutine is made inside the shielded task: a task cancelled
    # before its first step (a loop shutting down) then leaves no coroutine that
    # was never awaited behind.
    for row, lease in held:
        patch = unleased(row)
        try:
            async with asyncio.timeout(max(lease.renew_interval_s(), CALL_FLOOR_S)):
                await store.patch(row.id, patch, lease.token)
        except Exception:
            store.owed_releases.owe(row.id, patch, lease.token)


async def _release_write(store: JobRunStore, run_id: str, patch: RunPatch, lease: Lease) -> bool:
    """A fenced write that ends the lease; owed (then raised) when the store fails it."""
    try:
        return await store.patch(run_id, patch, lease.token)
    except BaseException:
        # Cancelled too (the pass's fence gave up on it, or the drive was
        # stopped): unanswered, it may or may not have landed, so it is owed.
        store.owed_releases.owe(run_id, patch, lease.token)
        raise


async def fail_run(
    store: JobRunStore, row: RunRow, reason: str, lease: Lease, clock: Clock
) -> PassOutcome:
    """End a held run as ``failed`` without a pass, for a reason the driver found."""
    patch = failed_patch(row, reason, format_instant(clock.now()))
    if not await _release_write(store, row.id, patch, lease):
        return PassOutcome("superseded")
    return PassOutcome("failed", reason)


async def fail_for_takeovers(
    store: JobRunStore, row: RunRow, max_takeovers: int, lease: Lease, clock: Clock
) -> PassOutcome:
    """End a run whose passes keep outliving their leases (taken over too often)."""
    reason = takeovers_exceeded_reason(row.lease_takeovers, max_takeovers)
    return await fail_run(store, row, reason, lease, clock)


def fails_at_once(error: Exception) -> bool:
    """A mistake in handler code: it would fail the same way on every retry."""
    return isinstance(error, HandlerMistakeError | StepReusedError)


async def record_failure(
    store: JobRunStore,
    clock: Clock,
    random: Callable[[], float],
    row: RunRow,
    lease: Lease,
    job_policy: RetryPolicy,
    error: Exception,
) -> PassOutcome:
    """Record a failed pass: retried after its policy's backoff, or failed for good."""
    attempts = row.attempts + 1
    # A step failure is judged by the step's own attempts and policy; anything
    # else by the run's consecutive failures and the job's policy.
    if isinstance(error, StepFailedError):
        policy, against = error.policy, error.attempts
    else:
        policy, against = job_policy, attempts
    exhausted = fails_at_once(error) or against >= policy.max_attempts
    text = cap_error_text(describe_exception(error))
    at = format_instant(clock.now())
    next_attempt_at = None if exhausted else policy.next_attempt_at(against, at, random)
    patch = pass_failure_patch(row, text, at, next_attempt_at, exception_origin(error))
    if not await _release_write(store, row.id, patch, lease):
        return PassOutcome("superseded", text)
    return PassOutcome("failed" if exhausted else "retrying", text, next_attempt_at=next_attempt_at)


async def defer(
    store: JobRunStore,
    clock: Clock,
    row: RunRow,
    lease: Lease,
    deferral: RetryAfter,
    max_deferrals: int,
) -> PassOutcome:
    """End a pass that raised ``RetryAfter``: due again ``deferral.seconds`` from now.

    Nothing is committed and nothing charged; the ledger stays, so the next pass
    replays the steps that finished in this one. The deferral past
    ``max_deferrals`` in a row fails the run instead.
    """
    now = clock.now()
    if row.deferrals >= max_deferrals:
        reason = deferrals_exceeded_reason(row.deferrals, max_deferrals, deferral.reason)
        return await fail_run(store, row, cap_error_text(reason), lease, clock)
    # On the store's clock (the drive's clock is aligned to it), like every due time.
    due_at = format_instant(now + timedelta(seconds=deferral.seconds))
    patch = deferred_patch(row, deferral.reason, format_instant(now), due_at)
    if not await _release_write(store, row.id, patch, lease):
        return PassOutcome("superseded")
    # The text is for the pass's observers (its log line); no error is counted.
    return PassOutcome("deferred", describe_exception(deferral), next_attempt_at=due_at)
