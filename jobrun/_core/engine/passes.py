"""One pass: call the handler once, then commit its cursor or record its failure.

Round trips a pass costs on the store, in order:

* one ledger read, at the first ``step()`` (skipped when the driver knows the
  ledger is empty because it just committed the previous pass itself); memo hits
  are answered from that read, never from another query;
* one ledger write per finished step attempt (the durability a kill relies on);
* one commit (patch plus ledger drop, a single transaction) or one failure patch,
  sent by :mod:`jobrun._core.engine.outcomes`, where every write that ends a pass lives.

Every write is fenced on the pass's lease token (see ``lease.py``); a refused
write ends the pass as ``superseded`` and nothing more is written.

What every pass of one drive shares (the store, the clock, chance, the id
minter, the host's ``open_scope``, the budget, the watchdog) is one
:class:`PassSettings`, built once per drive.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeAlias

from jobrun._core.engine.limit_gate import HeldSlot, LimitGate
from jobrun._core.engine.limit_pauses import LimitPausedDeferral, defer_for_paused_limit
from jobrun._core.engine.mapping import DEFAULT_CONCURRENCY, plan_map, run_map
from jobrun._core.engine.observe import PassProbe
from jobrun._core.engine.outcomes import (
    PassOutcome,
    cap_error_text,
    commit,
    defer,
    hand_back,
    record_failure,
)
from jobrun._core.engine.upgrades import upgrade_run
from jobrun._core.leases.fencing import idempotency_key
from jobrun._core.leases.renewal import BodyGuard, Lease, LeaseKeeper
from jobrun._core.limits.declarations import LimitDeclarations, StepLimits
from jobrun._core.model.fast_json import loads_own
from jobrun._core.model.formats import (
    JSON_SCALARS,
    MalformedColumnError,
    decode_counters,
    decode_json,
    format_instant,
    is_count,
)
from jobrun._core.model.names import name_problem, shown_name
from jobrun._core.model.records import RunKey, RunRow, StepRow
from jobrun._core.model.refusals import as_mistake, checked_seconds, is_int, mistake
from jobrun._core.model.results import (
    KEEP_CURSOR,
    HandlerResult,
    PassResult,
    refuse_generator,
    step_result_text,
)
from jobrun._core.port import WRITTEN_PAUSED, JobRunStore
from jobrun._core.rules.retry import DEFAULT_RETRY, RetryPolicy
from jobrun._core.rules.versions import Upgrade
from jobrun._core.time.clock import Clock
from jobrun._core.time.wall_steps import boot_instant
from jobrun.errors import (
    HandlerMistakeError,
    JobRunError,
    JobRunPausedError,
    JobValidationError,
    LeaseLostError,
    PassTimeoutError,
    RetryAfter,
    StepFailedError,
    StepReusedError,
    StepTimeoutError,
    describe_exception,
    timed_out_text,
)

__all__ = [
    "KEEP_CURSOR",
    "HandlerResult",
    "JobPass",
    "PassResult",
    "PassSettings",
    "run_job_pass",
]


Handler: TypeAlias = Callable[["JobPass"], Any]
OpenScope: TypeAlias = Callable[[RunKey], Any]


@dataclass(frozen=True, slots=True)
class PassSettings:
    """What every pass of one drive shares: built once per drive, handed to each pass.

    ``random`` draws retry jitter; ``mint_id`` makes the fresh token of a lease
    handed on to the next pass; ``timeout_s`` is the pass budget (``None``: no
    budget); ``guard`` watches step bodies the lease keeper cannot cancel;
    ``limits`` are the registry's rate and concurrency limits (``None``: none).
    """

    store: JobRunStore
    clock: Clock
    random: Callable[[], float]
    mint_id: Callable[[], str]
    open_scope: OpenScope
    timeout_s: float | None = None
    guard: BodyGuard | None = None
    limits: LimitDeclarations | None = None


class _ReadOnlyCounters(Mapping[str, int | float]):
    """``p.counters``: a live, read-only view; writing to it names the fix."""

    __slots__ = ("_counters",)

    def __init__(self, counters: dict[str, int | float]) -> None:
        self._counters = counters

    def __getitem__(self, name: str) -> int | float:
        return self._counters[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counters)

    def __len__(self) -> int:
        return len(self._counters)

    def __repr__(self) -> str:
        return repr(self._counters)

    def __setitem__(self, name: str, value: object) -> None:
        raise mistake(
            "counters",
            f"p.counters[{name!r}] = ... : p.counters is read-only; "
            f"use p.count({name!r}, by) to add to a counter",
        )

    def __delitem__(self, name: str) -> None:
        raise mistake("counters", f"del p.counters[{name!r}]: p.counters is read-only")


class JobPass:
    """The handler's view of one pass: what it reads, and how it records progress.

    Read:

    * ``payload``: the value the run was started with (decoded JSON).
    * ``cursor``: where the previous pass stopped (``None`` on the first pass).
    * ``counters``: the committed counters plus this pass's ``count()`` calls, a
      read-only mapping of name to number.
    * ``run``: the run's id and key (``RunKey``: id, module_id, job, instance).
    * ``lease_epoch``: this pass's fencing epoch, an int that grows with every
      claim of the run and every lease handed on to a next pass, so a higher
      epoch is always the later holder, whichever host it runs on. An outside
      store that keeps the highest epoch it has seen and refuses writes below it
      is fenced against a holder that lost its lease (the lease token, a
      ULID, cannot be compared that way).

    Do:

    * ``await p.step(name, fn, retry=None, *, rate_limit=None, concurrency_limit=None)``:
      run ``fn`` (sync, or returning an awaitable) once; its result is stored as
      JSON before ``step`` returns, and a later pass of the same cursor gets the
      stored result without calling it.
    * ``await p.map(fn, items, name=..., concurrency=8)``: ``fn(item)`` as step
      ``name(item)`` for each item, at most ``concurrency`` at once, results in
      item order (see the method). Steps may also run side by side with
      ``asyncio.gather(p.step(...), ...)``; each is durable when it ends.
    * ``p.count(name, by=1)``: add to a counter, committed with the pass.
    * ``await p.scope()``: what the host's ``open_scope(run)`` gives (by default
      the store's engine), opened at first use.
    * ``p.idempotency_key(step_name)``: a key for an outside write made by that
      step, the same on every replay of this pass (see the method).

    Then return ``PassResult(cursor=..., done=...)`` (see :class:`PassResult`).
    The driver makes one per pass; handlers never construct it.
    Mistakes in using this object (a bad step name, a ``step`` never awaited, a
    result JSON cannot store) fail the run at once with a message saying what
    to fix; the operator resumes it after the fix.
    """

    run: RunKey
    payload: Any
    cursor: Any
    counters: Mapping[str, int | float]
    lease_epoch: int

    def __init__(
        self,
        settings: PassSettings,
        row: RunRow,
        keeper: LeaseKeeper,
        job_policy: RetryPolicy,
        *,
        ledger_known_empty: bool = False,
        probe: PassProbe | None = None,
    ) -> None:
        self.run = RunKey(row.id, row.module_id, row.job, row.instance)
        self.lease_epoch = row.lease_epoch
        # 1 for the run's first pass; a retry or takeover replays the same number.
        self._pass_number = row.passes_committed + 1
        # A malformed row fails the pass here (inside its try), not the drive.
        counters, self.payload, self.cursor = _decoded(row)
        # Read-only to the handler: every write goes through count(), which checks it.
        self._counters = counters
        self.counters = _ReadOnlyCounters(counters)
        self._store = settings.store
        self._job_policy = job_policy
        self._clock = settings.clock
        self._open_scope = settings.open_scope
        self._used: set[str] = set()
        self._ledger: dict[str, StepRow] | None = {} if ledger_known_empty else None
        # Steps run side by side (p.map, gather) share the one ledger read.
        self._ledger_read = asyncio.Lock()
        self._scope_task: asyncio.Future[Any] | None = None
        self._lease = keeper.lease
        self._keeper = keeper
        self._gate = LimitGate(
            settings.limits or LimitDeclarations(), self._store, self._clock, keeper, self.run.id
        )
        self._probe = probe
        # Step coroutines handed out but not started yet, by call number.
        self._unstarted: dict[int, tuple[str, Coroutine[Any, Any, Any]]] = {}
        self._step_calls = 0
        # The step failure a KeyboardInterrupt or SystemExit from a step body stands for.
        self._exit_failure: StepFailedError | None = None
        # A step write found the run paused: no step starts again in this pass.
        self._paused = False

    def count(self, name: str, by: int | float = 1) -> None:
        """Add ``by`` (a finite int or float) to counter ``name``.

        Committed with the pass; dropped, with the rest of the pass, if it fails.
        """
        if name not in self._counters:
            if not isinstance(name, str):
                raise mistake(
                    "counters",
                    f"p.count() got a counter name of type {type(name).__name__}: use a str",
                )
            problem = name_problem(name)
            if problem is not None:
                raise mistake("counters", f"counter name {shown_name(name)} {problem}")
        if not is_count(by):
            raise mistake(
                "counters",
                f"p.count({name!r}, by={_shown_number(by)}): by must be a finite int or "
                "float, within a float's range (about 1.8e308)",
            )
        try:
            total = self._counters.get(name, 0) + by
        except OverflowError:
            # A huge int added to a float counter: the float cannot hold the sum.
            total = math.inf
        if not is_count(total):
            raise mistake("counters", f"counter {name!r} would overflow to {_shown_number(total)}")
        self._counters[name] = total

    def idempotency_key(self, step_name: str) -> str:
        """A key for an outside write made in step ``step_name`` of this pass.

        ``<run id>-p<pass number>-<16 hex digits of the SHA-256 of step_name>``,
        e.g. ``01J9Z3V6Q8W2M4K7R5T1X0Y3N6-p3-729461faeb187aef`` for
        ``"charge-42"`` in a run's third pass: ASCII letters,
        digits and ``-``, at most 55 characters whatever the name's length. The
        pass number counts the run's committed passes (1 for the first pass), so
        every retry of a failed pass and every takeover of an interrupted one,
        which replay the same ledger from the same cursor, get the same key,
        and the next pass gets a new one. Give it to an API that remembers keys
        (an ``Idempotency-Key`` header) and a step body run twice takes effect
        once. ``step_name`` is checked like a step's name; it need not be the
        name of the step making the call, only the same on every replay.
        """
        if not isinstance(step_name, str):
            raise mistake(
                "idempotency_key",
                f"p.idempotency_key() got a step name of type {type(step_name).__name__}: "
                "use a str",
            )
        problem = name_problem(step_name)
        if problem is not None:
            raise mistake("idempotency_key", f"step name {shown_name(step_name)} {problem}")
        return idempotency_key(self.run.id, self._pass_number, step_name)

    async def scope(self) -> Any:
        """What the host's ``open_scope(run)`` returns; opened at first use, once per pass."""
        if self._scope_task is None:
            self._scope_task = asyncio.ensure_future(self._open())
        try:
            # Shielded: one caller being cancelled must not cancel the others' scope.
            return await asyncio.shield(self._scope_task)
        except _CarriedExit as carried:
            # Raised again in the pass's own task, where the handler call records it.
            raise carried.raised from None

    async def _open(self) -> Any:
        try:
            opened = self._open_scope(self.run)
            return await opened if inspect.isawaitable(opened) else opened
        except asyncio.CancelledError:
            raise
        except Exception:
            raise
        except BaseException as error:
            # Out of a task of its own, asyncio would stop the event loop with it.
            raise _CarriedExit(error) from error

    def step(
        self,
        name: str,
        fn: Callable[[], Any],
        retry: RetryPolicy | None = None,
        *,
        rate_limit: str | None = None,
        concurrency_limit: str | None = None,
        timeout_s: float | None = None,
    ) -> Awaitable[Any]:
        """Run ``fn`` once for this pass, or return the result it already committed; await it.

        ``fn`` takes no arguments; it may be sync or return an awaitable. Its
        result is stored as JSON before the await returns and comes back decoded
        from that JSON, the same on the first run as on a replay. ``name`` is
        unique within the pass (a second call raises ``StepReusedError``).

        When ``fn`` raises, the attempt is recorded and ``StepFailedError`` is
        raised; unless the handler catches it, the pass fails and the run is
        retried after a backoff, judged by the step's attempts against ``retry``
        (default: the job's policy; a step policy replaces it, nothing is
        inherited). The retried pass replays the steps that completed and calls
        this one again; once its attempts are spent the run ends ``failed``.
        A result JSON cannot store fails the run at once (the body is not rerun).

        ``rate_limit`` names a rate limit declared on the registry: the body waits
        for one of its tokens. ``concurrency_limit`` is a key (computed by the
        handler) that a declared prefix covers: the body waits until fewer bodies
        than the limit run under that key, on every driver. Both are taken only
        when the body is about to run, never for a step the ledger answers; an
        undeclared name fails the run at once.

        ``timeout_s`` bounds one attempt of the body: past it the awaitable ``fn``
        returned is cancelled and the attempt fails as any other (``StepTimeoutError``,
        a ``StepFailedError``; last error "step 'x' timed out after N s"), retried by
        the step's policy. A synchronous body cannot be interrupted: its result
        counts however long it took, and one that blocks the event loop past the
        lease is what the watchdog is for. Work the body hands to a thread
        (``asyncio.to_thread``) is not stopped by the cancellation either.
        """
        timeout_s = _checked_step_call(name, fn, retry, timeout_s)
        limits = self._gate.resolve(name, rate_limit, concurrency_limit)
        number = self._step_calls
        self._step_calls = number + 1
        # Without a probe the step's own coroutine is handed out: one layer fewer.
        if self._probe is None:
            running = self._step(number, name, fn, retry, limits, timeout_s)
        else:
            running = self._probed_step(
                self._probe,
                number,
                name,
                lambda: self._step(None, name, fn, retry, limits, timeout_s),
            )
        self._unstarted[number] = (name, running)
        return running

    async def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        name: Callable[[Any], str],
        concurrency: int = DEFAULT_CONCURRENCY,
        retry: RetryPolicy | None = None,
        rate_limit: Any = None,
        concurrency_limit: str | Callable[[Any], str] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Run ``fn(item)`` as step ``name(item)`` for every item, at most
        ``concurrency`` (default 8) at once; the results in item order.

        Each item is a ``p.step`` of its own (durable when it ends, answered from
        the ledger on a replay); ``retry``, ``rate_limit`` and ``concurrency_limit``
        (a str, or a callable item -> str) and ``timeout_s`` (each item's own bound)
        go to each step when given. Every name is checked before anything runs.
        The first item to raise stops new items; the running ones end and are
        recorded, then its exception is raised. See :mod:`jobrun._core.engine.mapping`.
        """
        plan = plan_map(
            fn,
            items,
            name=name,
            concurrency=concurrency,
            retry=retry,
            rate_limit=rate_limit,
            concurrency_limit=concurrency_limit,
            used=self._used,
            timeout_s=None if timeout_s is None else _checked_timeout(timeout_s, "p.map"),
        )
        return await run_map(self.step, plan)

    async def _probed_step(
        self, probe: PassProbe, number: int, name: str, step: Callable[[], Awaitable[Any]]
    ) -> Any:
        # Started: no longer a step coroutine nobody awaited (the inner one is awaited here).
        del self._unstarted[number]
        return await probe.around_step(name, step, lambda: self._attempt_of(name))

    def _close_unawaited_steps(self) -> HandlerMistakeError | None:
        """Close the step coroutines nobody awaited; the mistake to report, if any."""
        if not self._unstarted:
            return None
        names = [name for name, _ in self._unstarted.values()]
        for _, running in self._unstarted.values():
            # Closed, so Python does not warn "coroutine ... was never awaited" later.
            running.close()
        self._unstarted.clear()
        shown = ", ".join(repr(name) for name in names)
        return mistake(
            "step",
            f"p.step({shown}, ...) was called without `await`, so the step never ran: "
            "write `await p.step(...)` (the handler must be `async def`)",
        )

    def _attempt_of(self, name: str) -> int | None:
        """After a step returned: ``None`` if the ledger answered it, else the attempt that ran."""
        prior = None if self._ledger is None else self._ledger.get(name)
        if prior is not None and prior.result is not None:
            return None
        return (prior.attempts if prior is not None else 0) + 1

    async def _step(
        self,
        number: int | None,
        name: str,
        fn: Callable[[], Any],
        retry: RetryPolicy | None,
        limits: StepLimits,
        timeout_s: float | None,
    ) -> Any:
        self._started(number, name)
        if self._paused:
            # Sticky, like a lost lease: the pass ends paused however the handler goes on.
            raise JobRunPausedError(self.run.id)
        # A step's policy replaces the job's wholesale; nothing is inherited.
        policy = retry if retry is not None else self._job_policy
        ledger = self._ledger if self._ledger is not None else await self._read_ledger()
        prior = ledger.get(name)
        if prior is not None and prior.result is not None:
            return decode_json(prior.result, f"step {name!r} result")
        attempts = self._next_attempt(name, prior, policy)
        # The step's slot and token: only now that its body is about to run.
        held = await self._gate.enter(limits, name) if limits.any else None
        try:
            if held is None and self._keeper.guard is None and timeout_s is None:
                # Nothing to watch or let go of: the body is called here (``_body``
                # without its coroutine, on every step of a driver without a watchdog).
                value = fn()
                if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
                    value = await value
            else:
                value = await self._body(fn, held, timeout_s)
        except RetryAfter as deferral:
            await self._deferring(name, deferral)
            raise
        except BaseException as error:
            raised = await self._failed_attempt(name, attempts, policy, error)
            if raised is error:
                raise
            raise raised from error
        # Not storable is a mistake, not a failed attempt: retrying would run the body again.
        stored = step_result_text(name, value, self._store.limits.max_step_result_bytes)
        # The write that makes the step durable; the one round trip a new step costs
        # (``_record`` and ``keeper.call`` written out: no coroutine layer per step).
        row = StepRow(name, stored, attempts, None)
        calls, lease = self._keeper.calls, self._lease
        started = self._clock.monotonic()
        calls.append(started)
        try:
            applied = await self._store.record_step(self.run.id, row, self._now(), lease.token)
        finally:
            calls.remove(started)
        if not applied:
            self._refused()
        if applied == WRITTEN_PAUSED:
            self._paused = True
        # What a replay returns: the stored JSON decoded (a scalar decodes to itself).
        return value if type(value) in JSON_SCALARS else loads_own(stored)

    def _next_attempt(self, name: str, prior: StepRow | None, policy: RetryPolicy) -> int:
        """The number of the attempt a step body is about to make; raises when none may
        start (the lease is gone, or the step's attempts are spent)."""
        if self._keeper.fenced():
            # Sticky: once the lease is gone (or can no longer be vouched for), no
            # step body starts again in this pass.
            raise LeaseLostError(self.run.id)
        if prior is not None and prior.attempts >= policy.max_attempts:
            # Spent: nothing is called and nothing is written.
            raise StepFailedError(name, prior.attempts, policy, prior.last_error or "exhausted")
        return (prior.attempts if prior is not None else 0) + 1

    async def _deferring(self, name: str, deferral: RetryAfter) -> None:
        """A step body raised ``RetryAfter``: not a failed attempt, nothing is recorded,
        and the pass is deferred unless the handler catches it. Naming a rate limit,
        it cools the limit down for every driver first (``limit_gate.cool``)."""
        if deferral.rate_limit is not None:
            await self._gate.cool(name, deferral)

    def _started(self, number: int | None, name: str) -> None:
        if number is not None:
            # Started: no longer a step coroutine nobody awaited.
            del self._unstarted[number]
        # The reuse check comes first: it also catches a name whose first call failed.
        if name in self._used:
            raise StepReusedError(name)
        self._used.add(name)

    async def _read_ledger(self) -> Mapping[str, StepRow]:
        """The one ledger read of the pass (steps started together share it): every
        later memo hit is served from it."""
        async with self._ledger_read:
            if self._ledger is None:
                self._ledger = await self._keeper.call(self._store.steps(self.run.id))
            return self._ledger

    async def _failed_attempt(
        self, name: str, attempts: int, policy: RetryPolicy, error: BaseException
    ) -> BaseException:
        """A step body raised ``error``: record the failed attempt and say what the
        step raises (``error`` itself when it interrupts the pass, or is the job's
        own exit)."""
        if isinstance(error, _TimedOut):
            await self._record(StepRow(name, None, attempts, timed_out_text(error.timeout_s)))
            return StepTimeoutError(name, attempts, policy, error.timeout_s)
        if isinstance(error, Exception):
            cause = cap_error_text(describe_exception(error))
        elif interrupts_the_pass(error):
            return error
        else:
            cause = cap_error_text(raised_by_user_code(error, "the step's code"))
        # Written before raising so the next pass knows how many attempts were spent.
        await self._record(StepRow(name, None, attempts, cause))
        failure = StepFailedError(name, attempts, policy, cause)
        if isinstance(error, KeyboardInterrupt | SystemExit):
            # Goes on as itself, so a handler's `except Exception` cannot keep
            # the pass going; the handler call turns it into the failure.
            self._exit_failure = failure
            return error
        return failure

    async def _body(
        self, fn: Callable[[], Any], held: HeldSlot | None = None, timeout_s: float | None = None
    ) -> Any:
        """Run a step body, watched by the guard (if any) until it ends, cancelled past
        ``timeout_s`` (if given); then let go of its concurrency slot (if ``held``),
        however it ended."""
        guard = self._keeper.guard
        entered = (
            None if guard is None else guard.enter(self._keeper.kill_at_s, self._keeper.presence_fd)
        )
        try:
            if timeout_s is not None:
                return await _within(timeout_s, fn)
            value = fn()
            if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
                value = await value
            return value
        finally:
            if guard is not None:
                guard.leave(entered)
            if held is not None:
                await held.release()

    async def _record(self, row: StepRow) -> None:
        written = await self._keeper.call(
            self._store.record_step(self.run.id, row, self._now(), self._lease.token)
        )
        if not written:
            self._refused()
        if written == WRITTEN_PAUSED:
            self._paused = True

    def _refused(self) -> None:
        """A step write was refused: the lease is gone. The pass stops even if the
        handler catches this."""
        self._keeper.lose(refused=True)
        raise LeaseLostError(self.run.id)

    def _now(self) -> str:
        return format_instant(self._clock.now())


def _checked_step_call(name: object, fn: object, retry: object, timeout_s: object) -> float | None:
    """A ``p.step`` call's arguments checked before anything runs (each a handler's
    mistake); its ``timeout_s`` as a float."""
    if not isinstance(name, str):
        raise mistake("step", f"a step name must be a str, got {type(name).__name__}")
    problem = name_problem(name)
    if problem is not None:
        raise mistake("step", f"step name {shown_name(name)} {problem}")
    if not callable(fn):
        raise mistake("step", f"step {name!r}: fn must be callable, got {type(fn).__name__}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise mistake(
            "step", f"step {name!r}: retry must be a RetryPolicy, got {type(retry).__name__}"
        )
    return None if timeout_s is None else _checked_timeout(timeout_s, f"step {name!r}")


async def _within(timeout_s: float, fn: Callable[[], Any]) -> Any:
    """``fn``'s result, its awaitable cancelled past ``timeout_s`` (a synchronous ``fn``
    holds the loop, so nothing can cancel it: its result stands)."""
    window = asyncio.timeout(timeout_s)
    try:
        async with window:
            value = fn()
            if type(value) not in JSON_SCALARS and inspect.isawaitable(value):
                value = await value
            return value
    except TimeoutError:
        if window.expired():
            # Ours, not a TimeoutError the body raised itself.
            raise _TimedOut(timeout_s) from None
        raise


class _TimedOut(Exception):
    """A step body's attempt ran past its ``timeout_s`` (turned into ``StepTimeoutError``
    once the failed attempt is recorded)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timed_out_text(timeout_s))
        self.timeout_s = timeout_s


def _checked_timeout(timeout_s: object, where: str) -> float:
    """A step's (or a map's) ``timeout_s``: a positive, finite number of seconds, or the
    handler's mistake, told as ``where`` (``step 'x'``, ``p.map``)."""
    try:
        return checked_seconds(timeout_s, "timeout_s")
    except JobValidationError as error:
        raise as_mistake(error, f"{where}: {error.message}") from None


def _shown_number(value: object) -> str:
    """A number as a message shows it: a huge int by its size, not 400 digits."""
    if is_int(value) and value.bit_length() > 64:
        # Counted from the bits: str() of a very large int raises.
        return f"an int of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        return repr(value)
    except Exception:
        return f"a {type(value).__name__}"


class _CarriedExit(Exception):
    """A ``BaseException`` from ``open_scope`` (not a cancellation), out of its task."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


def interrupts_the_pass(error: BaseException) -> bool:
    """Whether a ``BaseException`` that is not an ``Exception`` stops the pass
    (nothing recorded, the lease handed back, the exception goes on) rather than
    failing it.

    A cancellation of the pass's own task does (the lease keeper, the pass
    budget and the host all cancel through the task). A ``CancelledError`` while
    nobody is cancelling the task (``cancelling()`` is 0) was raised by user
    code, often from awaiting a future someone else cancelled; like
    ``GeneratorExit`` it is a failed attempt. So are ``KeyboardInterrupt`` and
    ``SystemExit``, which the driver then raises again (see :class:`UserExit`).
    A ``BaseException`` class of the user's own stops the pass, as before: tests
    raise one to stand for the process dying (``jobrun worker`` logs it and goes
    on, see ``jobrun.worker``).
    """
    if isinstance(error, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is None or task.cancelling() > 0
    return not isinstance(error, GeneratorExit | KeyboardInterrupt | SystemExit)


def raised_by_user_code(error: BaseException, where: str) -> str:
    """The failure text of a ``BaseException`` user code raised that is no interruption."""
    text = f"{describe_exception(error)} raised by {where}"
    if isinstance(error, asyncio.CancelledError):
        return f"{text} (not a cancellation of the pass)"
    return text


class UserExit(Exception):
    """``KeyboardInterrupt`` or ``SystemExit`` raised by user code in a pass.

    Carried out of the handler call as an ordinary failure, so the pass records
    it (charging the attempt; that write also releases the lease). The outcome
    then carries ``raised`` back to the driver, which raises it again, unless its
    caller (the worker) asked to go on with other runs.
    """

    def __init__(self, failure: Exception, raised: KeyboardInterrupt | SystemExit) -> None:
        super().__init__(describe_exception(failure))
        self.failure = failure
        self.raised = raised


class PassJob(Protocol):
    """What a pass needs of a registered job (``engine.registry.RegisteredJob`` is
    one); named here so the registry can name this module's handler type without
    a circle back."""

    @property
    def handler(self) -> Handler: ...
    @property
    def retry(self) -> RetryPolicy | None: ...
    @property
    def max_deferrals(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def upgrades(self) -> tuple[Upgrade, ...]: ...


async def run_job_pass(
    settings: PassSettings,
    job: PassJob,
    row: RunRow,
    lease: Lease,
    *,
    leased_at_s: float | None = None,
    ledger_known_empty: bool = False,
    keep_lease: bool = False,
    probe: PassProbe | None = None,
) -> PassOutcome:
    """Run one pass of ``row``, a run of ``job`` that this driver holds under ``lease``.

    Handler problems become outcomes, never exceptions. With ``keep_lease`` an
    advancing commit hands the lease straight to the next pass. ``leased_at_s``
    (the pass clock's monotonic seconds when the claim or commit that wrote the
    lease was sent) and the settings' ``guard`` set the self-fence (see ``lease.py``).

    A cancellation of the pass's task is not caught: nothing is committed, the
    ledger keeps what finished, the lease is handed back, the cancellation goes
    on. Anything else user code raises is a failed attempt (see
    ``interrupts_the_pass``); an exit also comes back in the outcome's ``raised``.
    """
    store, clock = settings.store, settings.clock
    job_policy = job.retry if job.retry is not None else DEFAULT_RETRY
    keeper = _keeper_for(settings, row, lease, leased_at_s)
    context: JobPass | None = None
    try:
        # Newer code first makes the run its version (versions.py); its ledger is then empty.
        fresh = await upgrade_run(store, clock, row, job.version, job.upgrades, keeper)
        known_empty, row = ledger_known_empty or fresh is not row, fresh
        context = JobPass(
            settings, row, keeper, job_policy, ledger_known_empty=known_empty, probe=probe
        )
        result = await _call_handler(job.handler, context, keeper, clock, settings.timeout_s)
        if context._paused:
            return await _paused(store, clock, row, lease)
        minted = settings.mint_id if keep_lease else None
        committing = commit(store, clock, row, lease, result, context.counters, minted, job.version)
        return await _within_fence(keeper, row.id, committing)
    except LeaseLostError:
        if not keeper.refused:
            # The holder stopped itself (self-fence, lost presence, a call that never
            # answered) and may still hold the lease: handed back, so any driver may
            # take the run at once.
            await hand_back(store, row, lease)
        return PassOutcome("superseded")
    except Exception as error:
        if context is not None and context._paused:
            # Whatever the handler made of it: nothing charged, the lease handed back.
            return await _paused(store, clock, row, lease)
        ending = _ended_by(settings, job, keeper, row, lease, job_policy, error)
        return await _handed_back_if_interrupted(ending, store, row, lease)
    except BaseException:
        await hand_back(store, row, lease)
        raise


async def _handed_back_if_interrupted(
    ending: Awaitable[PassOutcome], store: JobRunStore, row: RunRow, lease: Lease
) -> PassOutcome:
    """The failure record's write, awaited; interrupted (the drive cancelled), that
    write is owed and may still land, and the hand-back on the same token frees the
    run now whichever of the two lands first. A store error goes on as it is (the
    write is owed; a hand-back would wait on the same failing store)."""
    try:
        return await ending
    except Exception:
        raise
    except BaseException:
        await hand_back(store, row, lease)
        raise


async def _paused(store: JobRunStore, clock: Clock, row: RunRow, lease: Lease) -> PassOutcome:
    """End a pass whose step write found the run paused: the lease handed back (the
    write parks the run until its unpause), nothing committed or charged."""
    await hand_back(store, replace(row, updated_at=format_instant(clock.now())), lease)
    return PassOutcome("paused")


async def _ended_by(
    settings: PassSettings,
    job: PassJob,
    keeper: LeaseKeeper,
    row: RunRow,
    lease: Lease,
    job_policy: RetryPolicy,
    error: Exception,
) -> PassOutcome:
    """The outcome of a pass the handler call ended with ``error``: deferred, or failed."""
    store, clock = settings.store, settings.clock
    if isinstance(error, LimitPausedDeferral):
        waiting = defer_for_paused_limit(store, clock, row, lease, error)
        return await _within_fence(keeper, row.id, waiting, UNANSWERED)
    if isinstance(error, RetryAfter):
        deferring = defer(store, clock, row, lease, error, job.max_deferrals)
        return await _within_fence(keeper, row.id, deferring, UNANSWERED)
    if isinstance(error, UserExit):
        failing = _failed(settings, row, lease, job_policy, error.failure)
        outcome = await _within_fence(keeper, row.id, failing, UNANSWERED)
        return replace(outcome, raised=error.raised)
    failing = _failed(settings, row, lease, job_policy, error)
    return await _within_fence(keeper, row.id, failing, UNANSWERED)


# A release write (failure, deferral) that never answered: it is owed (see
# ``outcomes._release_write``), and sent again before the next claim on the store.
UNANSWERED = PassOutcome("superseded", "the store did not answer the pass's last write")


def _extend_lease(
    store: JobRunStore, run_id: str, lease: Lease, clock: Clock, expires_at: str, now_at: str
) -> Awaitable[bool]:
    """Renew ``lease`` to ``expires_at``, and on the boot clock too where the clock has
    one (read after the keeper's, so that expiry ends no sooner than its fence)."""
    boot = boot_instant(clock)
    if boot is None:
        return store.extend_lease(run_id, lease.token, expires_at, now_at)
    boot_lease = boot.lease(lease.token, lease.lease_ms)
    return store.extend_lease(run_id, lease.token, expires_at, now_at, boot_lease)


def _keeper_for(
    settings: PassSettings, row: RunRow, lease: Lease, leased_at_s: float | None
) -> LeaseKeeper:
    store = settings.store
    return LeaseKeeper(
        lease,
        settings.clock,
        lambda expires_at, now_at: _extend_lease(
            store, row.id, lease, settings.clock, expires_at, now_at
        ),
        row.id,
        leased_at_s=leased_at_s,
        watch_presence=lambda lost: store.watch_presence(lease.presence, lost),
        guard=settings.guard,
    )


async def _within_fence(
    keeper: LeaseKeeper,
    run_id: str,
    write: Coroutine[Any, Any, PassOutcome],
    unanswered: PassOutcome | None = None,
) -> PassOutcome:
    """An outcome write, abandoned if it has not answered by ``keeper.write_deadline_s``
    (its connection is then discarded by the executor, never reused).

    Abandoned, it is a lost lease to the pass: ``unanswered`` is the outcome, or,
    without it (the commit), ``LeaseLostError``, so the lease is handed back.
    """
    # Real time: a network's time, whatever the pass's clock (a test clock that
    # moves on while the store answers must not abandon a healthy write).
    deadline = asyncio.timeout(keeper.write_deadline_s())
    try:
        async with deadline:
            return await write
    except TimeoutError:
        if not deadline.expired():
            raise
        keeper.lose()
        if unanswered is not None:
            return unanswered
        raise LeaseLostError(run_id) from None


async def _failed(
    settings: PassSettings, row: RunRow, lease: Lease, job_policy: RetryPolicy, error: Exception
) -> PassOutcome:
    return await record_failure(
        settings.store, settings.clock, settings.random, row, lease, job_policy, error
    )


def _decoded(row: RunRow) -> tuple[dict[str, int | float], Any, Any]:
    """The row's counters, payload and cursor, decoded in that order."""
    try:
        counters = decode_counters(row.counters)
    except MalformedColumnError as error:
        # Only a write that bypassed p.count() gets here; retrying cannot help.
        raise mistake(
            "counters",
            f"{error}; counters are written only through p.count(). Resuming the run "
            "keeps its valid counters and drops the rest",
        ) from error
    payload = decode_json(row.payload, "payload")
    cursor = None if row.cursor is None else decode_json(row.cursor, "cursor")
    return counters, payload, cursor


async def _call_handler(
    handler: Handler,
    context: JobPass,
    keeper: LeaseKeeper,
    clock: Clock,
    timeout_s: float | None,
) -> object:
    """Call the handler under the lease keeper and the pass budget.

    A step coroutine the handler never awaited fails the pass, whatever else
    happened: an error the handler then raised is usually its consequence.
    """
    # On the pass's clock, so a test clock can run out a long budget at once.
    budget = clock.timeout(timeout_s)
    # A wait for a rate-limit token moves this deadline on (see limit_gate).
    context._gate.budget = budget if timeout_s is not None else None
    try:
        async with keeper, budget:
            result = handler(context)
            refuse_generator(result)
            if inspect.isawaitable(result):
                result = await result
    except Exception as error:
        mistake = context._close_unawaited_steps()
        if mistake is not None:
            raise mistake from error
        # Only our own budget becomes a pass timeout; a handler's TimeoutError is its own.
        if isinstance(error, TimeoutError) and timeout_s is not None and budget.expired():
            raise PassTimeoutError(timeout_s) from error
        raise
    except BaseException as error:
        mistake = context._close_unawaited_steps()
        if interrupts_the_pass(error):
            raise
        raise _user_failure(error, context, mistake) from error
    mistake = context._close_unawaited_steps()
    if mistake is not None:
        raise mistake
    return result


def _user_failure(
    error: BaseException, context: JobPass, mistake: HandlerMistakeError | None
) -> Exception:
    """What a ``BaseException`` from the handler call (not an interruption) fails the pass as."""
    failure: Exception
    if mistake is not None:
        failure = mistake
    elif context._exit_failure is not None and isinstance(error, KeyboardInterrupt | SystemExit):
        failure = context._exit_failure
    else:
        failure = _HandlerRaised(raised_by_user_code(error, "the handler's code"))
    if isinstance(error, KeyboardInterrupt | SystemExit):
        return UserExit(failure, error)
    return failure


class _HandlerRaised(JobRunError):
    """Stands for a ``BaseException`` the handler raised; stored as its message."""
