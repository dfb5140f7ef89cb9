"""One pass: call the handler once, then commit its cursor or record its failure.

Round trips a pass costs on the store, in order:

* one ledger read, at the first ``step()`` (skipped when the driver knows the
  ledger is empty because it just committed the previous pass itself); memo hits
  are answered from that read, never from another query;
* one ledger write per finished step attempt (the durability a kill relies on);
* one commit (patch plus ledger drop, a single transaction) or one failure patch.

Every write is fenced on the pass's lease token (see ``lease.py``); a refused
write ends the pass as ``superseded`` and nothing more is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeAlias

from jobrun._core.clock import Clock
from jobrun._core.formats import (
    decode_counters,
    decode_json,
    encode_json,
    encode_json_within,
    format_instant,
)
from jobrun._core.lease import Lease, LeaseKeeper
from jobrun._core.names import require_name
from jobrun._core.observe import PassProbe
from jobrun._core.port import JobRunStore
from jobrun._core.queue_safety import encode_queue_safe
from jobrun._core.records import JobRunStatus, RunKey, RunPatch, RunRow, StepRow
from jobrun._core.retry import DEFAULT_RETRY, RetryPolicy
from jobrun._system import mint_run_id
from jobrun.errors import (
    JobValidationError,
    LeaseLostError,
    PassTimeoutError,
    StepFailedError,
    StepReusedError,
    describe_exception,
)

MAX_ERROR_TEXT_BYTES = 8 * 1024


class _Keep:
    """Marker for "keep the committed cursor" (a cursor of ``None`` commits JSON null)."""

    _instance: _Keep | None = None

    def __new__(cls) -> _Keep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "KEEP_CURSOR"


KEEP_CURSOR: Final = _Keep()
"""The default cursor of :class:`PassResult`: commit the cursor the pass started with.

A pass that returns ``PassResult(done=False)`` without a cursor is therefore
called again with the same cursor (useful while polling for something). To
store JSON ``null`` as the cursor, pass ``cursor=None`` explicitly.
"""


@dataclass(frozen=True, slots=True)
class PassResult:
    """What a handler hands back at the end of a pass.

    ``cursor`` is where the next pass starts (any queue-safe JSON value: numbers,
    strings, lists, dicts, ``None``); leave it out to keep the committed one.
    ``done=True`` ends the run as ``done``. The cursor and the pass's counters
    are committed together, in one transaction, and the step ledger is dropped
    with them. A mapping ``{"cursor": ..., "done": ...}`` is accepted too.
    """

    cursor: Any = KEEP_CURSOR
    done: bool = False


HandlerResult: TypeAlias = PassResult | Mapping[str, Any] | None
Handler: TypeAlias = Callable[["JobPass"], HandlerResult | Awaitable[HandlerResult]]
OpenScope: TypeAlias = Callable[[RunKey], Any]


@dataclass(frozen=True, slots=True)
class PassOutcome:
    status: Literal["advanced", "completed", "retrying", "failed", "superseded"]
    error: str | None = None
    # After an advancing commit that kept the lease: the row as now stored, so
    # the next pass needs no read.
    row: RunRow | None = None


def cap_error_text(text: str) -> str:
    """Cut a stored error text to 8 KiB of UTF-8, saying that it was cut.

    A NUL (which Postgres text cannot hold) is shown escaped, so an exception
    message can never make the failure record itself fail.
    """
    text = text.replace("\x00", "\\x00")
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_ERROR_TEXT_BYTES:
        return text
    kept = encoded[: MAX_ERROR_TEXT_BYTES - 64].decode("utf-8", errors="ignore")
    return f"{kept} [... cut, {len(encoded) - len(kept.encode('utf-8'))} more bytes]"


class JobPass:
    """The handler's view of one pass: its run, inputs, counters, steps and scope."""

    def __init__(
        self,
        *,
        store: JobRunStore,
        row: RunRow,
        payload: Any,
        cursor: Any,
        counters: dict[str, int | float],
        job_policy: RetryPolicy,
        clock: Clock,
        open_scope: OpenScope,
        ledger_known_empty: bool,
        lease: Lease,
        keeper: LeaseKeeper,
        probe: PassProbe | None = None,
    ) -> None:
        self.run = RunKey(row.id, row.module_id, row.job, row.instance)
        self.payload = payload
        self.cursor = cursor
        self.counters = counters
        self._store = store
        self._job_policy = job_policy
        self._clock = clock
        self._open_scope = open_scope
        self._used: set[str] = set()
        self._ledger: dict[str, StepRow] | None = {} if ledger_known_empty else None
        self._scope_task: asyncio.Future[Any] | None = None
        self._lease = lease
        self._keeper = keeper
        self._probe = probe

    def count(self, name: str, by: int | float = 1) -> None:
        """Add ``by`` to a counter; it is committed with the pass, dropped if the pass fails."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"counter name must be a non-empty str, got {name!r}")
        if isinstance(by, bool) or not isinstance(by, int | float) or not math.isfinite(by):
            raise TypeError(f"count({name!r}, by=...) needs a finite number, got {by!r}")
        self.counters[name] = self.counters.get(name, 0) + by

    async def scope(self) -> Any:
        """What the host's ``open_scope(run)`` returns; opened at first use, once per pass."""
        if self._scope_task is None:
            self._scope_task = asyncio.ensure_future(self._open())
        # Shielded: one caller being cancelled must not cancel the others' scope.
        return await asyncio.shield(self._scope_task)

    async def _open(self) -> Any:
        opened = self._open_scope(self.run)
        return await opened if inspect.isawaitable(opened) else opened

    async def step(
        self,
        name: str,
        fn: Callable[[], Any],
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Run ``fn`` once for this pass, or return the result it already committed.

        The result is stored as JSON before this returns and comes back decoded
        from that JSON, the same on the first run as on a replay.
        """
        probe = self._probe
        if probe is None:
            return await self._step(name, fn, retry)
        return await probe.around_step(
            name, lambda: self._step(name, fn, retry), lambda: self._attempt_of(name)
        )

    def _attempt_of(self, name: str) -> int | None:
        """After a step returned: ``None`` if the ledger answered it, else the attempt that ran."""
        prior = None if self._ledger is None else self._ledger.get(name)
        if prior is not None and prior.result is not None:
            return None
        return (prior.attempts if prior is not None else 0) + 1

    async def _step(self, name: str, fn: Callable[[], Any], retry: RetryPolicy | None) -> Any:
        require_name(name, "step name")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"step retry must be a RetryPolicy, got {type(retry).__name__}")
        # The reuse check comes first: it also catches a name whose first call failed.
        if name in self._used:
            raise StepReusedError(name)
        self._used.add(name)
        # A step's policy replaces the job's wholesale; nothing is inherited.
        policy = retry if retry is not None else self._job_policy
        if self._ledger is None:
            # The one ledger read of the pass: every later memo hit is served from it.
            self._ledger = await self._store.steps(self.run.id)
        prior = self._ledger.get(name)
        if prior is not None and prior.result is not None:
            return decode_json(prior.result, f"step {name!r} result")
        if self._keeper.lost:
            # Sticky: once the lease is gone, no step body starts again in this pass.
            raise LeaseLostError(self.run.id)
        attempts = (prior.attempts if prior is not None else 0) + 1
        if prior is not None and prior.attempts >= policy.max_attempts:
            # Spent: nothing is called and nothing is written.
            raise StepFailedError(name, prior.attempts, policy, prior.last_error or "exhausted")
        try:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            stored = encode_json_within(value, self._store.limits.max_step_result_bytes)
        except Exception as error:
            cause = cap_error_text(describe_exception(error))
            # Written before raising so the next pass knows how many attempts were spent.
            await self._record(StepRow(name, None, attempts, cause))
            raise StepFailedError(name, attempts, policy, cause) from error
        # The write that makes the step durable; the one round trip a new step costs.
        await self._record(StepRow(name, stored, attempts, None))
        return json.loads(stored)

    async def _record(self, row: StepRow) -> None:
        if not await self._store.record_step(self.run.id, row, self._now(), self._lease.token):
            # Refused: the lease is gone. The pass stops even if the handler catches this.
            self._keeper.lose()
            raise LeaseLostError(self.run.id)

    def _now(self) -> str:
        return format_instant(self._clock.now())


def _interpret(result: Any) -> tuple[Any, bool]:
    """``(cursor or KEEP_CURSOR, done)`` from what a handler returned."""
    if result is None:
        return KEEP_CURSOR, False
    if isinstance(result, PassResult):
        return result.cursor, result.done is True
    if isinstance(result, Mapping):
        unknown = sorted(str(key) for key in result if key not in ("cursor", "done"))
        if unknown:
            raise JobValidationError(
                f"the handler returned unknown key(s) {', '.join(map(repr, unknown))}; "
                "a pass result has only 'cursor' and 'done'",
                [{"path": f"result.{key}", "message": "unknown key"} for key in unknown],
            )
        return result.get("cursor", KEEP_CURSOR), result.get("done") is True
    raise JobValidationError(
        f"the handler returned a {type(result).__name__}; expected a PassResult, "
        "a mapping with 'cursor'/'done', or None",
        [{"path": "result", "message": f"a {type(result).__name__}"}],
    )


async def run_job_pass(
    *,
    store: JobRunStore,
    row: RunRow,
    handler: Handler,
    retry: RetryPolicy | None,
    clock: Clock,
    random: Callable[[], float],
    open_scope: OpenScope,
    lease: Lease,
    timeout_s: float | None = None,
    ledger_known_empty: bool = False,
    keep_lease: bool = False,
    probe: PassProbe | None = None,
) -> PassOutcome:
    """Run one pass of ``row``, which this driver holds under ``lease``.

    Handler problems become outcomes, never exceptions. With ``keep_lease`` an
    advancing commit hands the lease straight to the next pass.

    ``BaseException``s that are not ``Exception``s (cancellation, Ctrl-C) are not
    caught: the pass is not committed, the ledger keeps what finished, the lease
    is handed back so another driver need not wait for it to expire, and the
    exception goes on.
    """
    job_policy = retry if retry is not None else DEFAULT_RETRY
    keeper = LeaseKeeper(
        lease,
        clock,
        lambda expires_at: store.extend_lease(row.id, lease.token, expires_at),
        row.id,
    )
    try:
        # Decoded inside the try: a malformed row is a failed pass, not a crashed drive.
        counters = decode_counters(row.counters)
        payload = decode_json(row.payload, "payload")
        cursor = None if row.cursor is None else decode_json(row.cursor, "cursor")
        context = JobPass(
            store=store,
            row=row,
            payload=payload,
            cursor=cursor,
            counters=counters,
            job_policy=job_policy,
            clock=clock,
            open_scope=open_scope,
            ledger_known_empty=ledger_known_empty,
            lease=lease,
            keeper=keeper,
            probe=probe,
        )
        # On the pass's clock, so a test clock can run out a long budget at once.
        budget = clock.timeout(timeout_s)
        try:
            async with keeper, budget:
                result = handler(context)
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError as error:
            # Only our own budget becomes a pass timeout; a handler's TimeoutError is its own.
            if timeout_s is not None and budget.expired():
                raise PassTimeoutError(timeout_s) from error
            raise
        next_cursor, done = _interpret(result)
        if next_cursor is KEEP_CURSOR:
            cursor_text = row.cursor
        else:
            cursor_text = encode_queue_safe(next_cursor, "cursor", store.limits.max_cursor_bytes)
        at = format_instant(clock.now())
        kept = keep_lease and not done
        # A lease handed on gets a fresh token. Should this commit land unseen (its
        # reply lost, or the pass interrupted while awaiting it), the failure record
        # or hand-back this pass writes next, fenced on the old token, then misses
        # and can never write the pre-commit state over the commit.
        successor = replace(lease, token=mint_run_id()) if kept else None
        patch = RunPatch(
            status=JobRunStatus.DONE.value if done else JobRunStatus.RUNNING.value,
            cursor=cursor_text,
            counters=encode_json(context.counters),
            attempts=0,
            last_error=None,
            updated_at=at,
            # An outcome writes the real due time (now: NULL), never a lease
            # expiry, unless it hands the lease to this driver's next pass.
            next_attempt_at=lease.expiry_after(at) if kept else None,
            ended_at=at if done else None,
            lease_owner=successor.token if successor is not None else None,
            lease_driver=lease.driver if kept else None,
            lease_began_at=at if kept else None,
            lease_takeovers=0,
        )
        committed = replace(row, **{name: getattr(patch, name) for name in _PATCH_FIELDS})
        try:
            applied = await store.commit_pass(row.id, patch, lease.token)
        except BaseException:
            if successor is not None:
                # If the commit landed after all, give back the lease it handed on.
                await hand_back(store, committed, successor)
            raise
        if not applied:
            return PassOutcome("superseded")
        return PassOutcome("completed" if done else "advanced", row=committed)
    except LeaseLostError:
        return PassOutcome("superseded")
    except Exception as error:
        return await _record_failure(store, row, job_policy, error, clock, random, lease)
    except BaseException:
        await hand_back(store, row, lease)
        raise


_PATCH_FIELDS = tuple(RunPatch.__dataclass_fields__)


def _unleased(row: RunRow) -> RunPatch:
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
    )


async def hand_back(store: JobRunStore, row: RunRow, lease: Lease) -> None:
    """Give a held lease back (fenced), shielded from a cancellation in progress.

    Best effort: if it cannot be written, the lease simply expires and the run
    is taken over then.
    """
    with contextlib.suppress(Exception):
        await asyncio.shield(store.patch(row.id, _unleased(row), lease.token))


async def fail_run(
    store: JobRunStore, row: RunRow, reason: str, lease: Lease, clock: Clock
) -> PassOutcome:
    """End a held run as ``failed`` without a pass, for a reason the driver found."""
    at = format_instant(clock.now())
    patch = replace(
        _unleased(row),
        status=JobRunStatus.FAILED.value,
        last_error=reason,
        updated_at=at,
        ended_at=at,
    )
    if not await store.patch(row.id, patch, lease.token):
        return PassOutcome("superseded")
    return PassOutcome("failed", reason)


async def _record_failure(
    store: JobRunStore,
    row: RunRow,
    job_policy: RetryPolicy,
    error: Exception,
    clock: Clock,
    random: Callable[[], float],
    lease: Lease,
) -> PassOutcome:
    attempts = row.attempts + 1
    # A step failure is judged by the step's own attempts and policy; anything
    # else by the run's consecutive failures and the job's policy.
    if isinstance(error, StepFailedError):
        policy, against = error.policy, error.attempts
    else:
        policy, against = job_policy, attempts
    exhausted = against >= policy.max_attempts
    text = cap_error_text(describe_exception(error))
    at = format_instant(clock.now())
    written = await store.patch(
        row.id,
        RunPatch(
            status=JobRunStatus.FAILED.value if exhausted else JobRunStatus.RUNNING.value,
            # Written back verbatim: a failed pass never leaks the handler's state.
            cursor=row.cursor,
            counters=row.counters,
            attempts=attempts,
            last_error=text,
            updated_at=at,
            next_attempt_at=None if exhausted else policy.next_attempt_at(against, at, random),
            ended_at=at if exhausted else None,
            lease_takeovers=row.lease_takeovers,
        ),
        lease.token,
    )
    if not written:
        return PassOutcome("superseded", text)
    return PassOutcome("failed" if exhausted else "retrying", text)
