"""Waiting for a step's limits: the slot, then the token, just before its body runs.

Used by :mod:`jobrun._core.engine.passes` around a step body only when the body is about
to run (a step the ledger answers waits for nothing and takes nothing). The
order is slot first, then token: a token taken while still waiting for a slot
would let bodies bunch up faster than the rate once slots free.

* A token: one reservation on the bucket's store (``take_token``); the wait it
  returns is slept on the pass's clock, holding no connection, and the pass
  budget's deadline moves on by that wait (a wait for a token is not the
  handler's time). A wait beyond what is left of the budget gives the token
  back and ends the pass (:func:`jobrun._core.limits.declarations.too_long_a_wait`). Then
  this process's own pacer (:class:`jobrun._core.limits.declarations.Pacer`) keeps the bodies
  it releases to the burst jobrun spends at once, however late the process woke;
  a body that would still go out stale (its token's turn long past) reserves a
  new token, once (:func:`jobrun._core.limits.buckets.stale_after_s`).
* A paused key (:func:`jobrun.pause_limit`): the take's wait is infinite, or the
  slot is refused and a read says why; the pass is deferred until the unpause
  (:class:`jobrun._core.engine.limit_pauses.LimitPausedDeferral`), whatever its budget.
* A slot: ``acquire_slot`` until it answers yes, sleeping between tries with a
  backoff (50 ms doubling to 1 s), woken early when a step of this process lets
  go of a slot of the same key. These waits do count against the budget: a slot
  may stay taken for as long as its holder's body runs.

A slot is let go of when the body ends, however it ends; if that write fails,
the slot still stops counting when the pass ends (its lease is released or handed
on under a new token, and a slot counts only under its run's current lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from jobrun._core.engine.limit_pauses import LimitPausedDeferral
from jobrun._core.leases.renewal import LeaseKeeper
from jobrun._core.limits.buckets import stale_after_s, too_long_a_wait
from jobrun._core.limits.declarations import LimitDeclarations, RateLimit, StepLimits
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import BootInstant
from jobrun._core.port import JobRunStore
from jobrun._core.time.clock import Clock, Deadline
from jobrun._core.time.wall_steps import boot_instant, lease_instants
from jobrun.errors import LeaseLostError, RetryAfter, StoreError

FIRST_POLL_S = 0.05
LAST_POLL_S = 1.0


def remaining_s(budget: Deadline | None) -> float | None:
    """Seconds left of the pass budget, or ``None`` when there is no bound (or the
    clock's deadline cannot say)."""
    if budget is None:
        return None
    read = getattr(budget, "remaining_s", None)
    if read is not None:
        left: float | None = read()
        return left
    if isinstance(budget, asyncio.Timeout):
        when = budget.when()
        return None if when is None else when - asyncio.get_running_loop().time()
    return None


def extend(budget: Deadline | None, seconds: float) -> None:
    """Move the pass budget's deadline ``seconds`` later (a deadline that cannot be
    moved, from a clock of the caller's own, is left as it is)."""
    if budget is None or seconds <= 0:
        return
    move = getattr(budget, "extend", None)
    if move is not None:
        move(seconds)
    elif isinstance(budget, asyncio.Timeout):
        when = budget.when()
        if when is not None:
            budget.reschedule(when + seconds)


class HeldSlot:
    """A concurrency slot this pass holds for one step body."""

    def __init__(self, gate: LimitGate, key: str, step: str, token: str) -> None:
        self._gate = gate
        self.key = key
        self.step = step
        self.token = token

    async def release(self) -> None:
        """Let go of the slot (once), and wake this process's waiters for its key."""
        gate = self._gate
        try:
            now_at, boot = gate.slot_instant()
            await gate.store.release_slot(
                self.key, gate.run_id, self.step, self.token, now_at, boot
            )
        except StoreError:
            # Not lost: the slot stops counting when this pass's lease ends.
            pass
        finally:
            gate.declarations.wakeups.wake(self.key)


class LimitGate:
    """One pass's way through the limits its steps name."""

    def __init__(
        self,
        declarations: LimitDeclarations,
        store: JobRunStore,
        clock: Clock,
        keeper: LeaseKeeper,
        run_id: str,
    ) -> None:
        self.declarations = declarations
        self.store = store
        self.clock = clock
        self.keeper = keeper
        self.run_id = run_id
        # Set by the handler call: the pass budget a token wait moves on.
        self.budget: Deadline | None = None

    def slot_instant(self) -> tuple[str, BootInstant | None]:
        """The instant a slot's lease is judged at, as a claim judges a lease (a
        wall-clock step frees no slot), and the boot clock's reading."""
        judged, _written = lease_instants(self.clock)
        return format_instant(judged), boot_instant(self.clock)

    def resolve(self, step: str, rate_key: object, concurrency_key: object) -> StepLimits:
        """The declared limits a step names (a mistake, raised at once, if undeclared)."""
        return self.declarations.for_step(step, rate_key, concurrency_key)

    async def enter(self, limits: StepLimits, step: str) -> HeldSlot | None:
        """Wait for the step's slot, then its token; the slot held (to let go of when
        the body ends), if any."""
        if not limits.any:
            return None
        held = None
        if limits.concurrency is not None and limits.concurrency_key is not None:
            held = await self._slot(limits.concurrency_key, limits.concurrency.most, step)
        try:
            if limits.rate is not None:
                await self._token(limits.rate)
            if self.keeper.fenced():
                raise LeaseLostError(self.run_id)
        except BaseException:
            if held is not None:
                await held.release()
            raise
        return held

    async def _token(self, rate: RateLimit) -> None:
        """Reserve a token and wait for it; once more if the body would go out
        stale (later than :func:`jobrun._core.limits.declarations.stale_after_s` after the
        token's instant: its turn has passed, and others' requests took it)."""
        for retake in (False, True):
            due_s = await self._reserved(rate)
            await self._paced(rate)
            if retake or self.clock.monotonic() - due_s <= stale_after_s(
                rate.per_second, rate.burst
            ):
                return

    async def _reserved(self, rate: RateLimit) -> float:
        """Reserve the next token and sleep until its instant; that instant on this
        process's monotonic clock (counted from the store's answer)."""
        store: Any = self.store if rate.store is None else rate.store
        wait_s = float(await store.take_token(rate.key, rate.per_second, rate.burst))
        due_s = self.clock.monotonic() + max(0.0, wait_s)
        if wait_s <= 0:
            return due_s
        if wait_s == math.inf:
            # Paused: no token until it is unpaused, however long the budget.
            with contextlib.suppress(StoreError):
                await store.give_back_token(rate.key, rate.burst)
            raise LimitPausedDeferral(rate.key, until_unpaused=rate.store is None)
        left = remaining_s(self.budget)
        if left is not None and wait_s > left:
            with contextlib.suppress(StoreError):
                # Unused: another taker may have it sooner.
                await store.give_back_token(rate.key, rate.burst)
            raise too_long_a_wait(rate.key, wait_s)
        extend(self.budget, wait_s)
        await self.clock.sleep(wait_s)
        return due_s

    async def _paced(self, rate: RateLimit) -> None:
        """Wait for this process's own spacing of ``rate`` (see ``limits.Pacer``);
        not the handler's time either."""
        delay_s = self.declarations.pacer(rate).delay_s(self.clock.monotonic())
        if delay_s > 0:
            extend(self.budget, delay_s)
            await self.clock.sleep(delay_s)

    async def cool(self, step: str, deferral: RetryAfter) -> None:
        """A step raised ``RetryAfter(rate_limit=key)``: hold ``key``'s bucket for its
        seconds, for every driver (a key nobody declared is a mistake, raised). A
        failed write is not the pass's failure: the pass is deferred all the same,
        and only the other drivers go on asking until the API refuses them too."""
        key = deferral.rate_limit
        if key is None:
            return
        rate = self.declarations.for_step(step, key, None).rate
        assert rate is not None  # for_step raises for an undeclared key
        store: Any = self.store if rate.store is None else rate.store
        reason = deferral.reason or f"RetryAfter from step {step!r}"
        with contextlib.suppress(StoreError):
            await store.cool_limit(key, rate.per_second, rate.burst, deferral.seconds, reason)

    async def _slot(self, key: str, most: int, step: str) -> HeldSlot:
        delay_s = FIRST_POLL_S
        token = self.keeper.lease.token
        wakeups = self.declarations.wakeups
        while True:
            now_at, boot = self.slot_instant()
            if await self.store.acquire_slot(key, most, self.run_id, step, token, now_at, boot):
                return HeldSlot(self, key, step, token)
            if self.keeper.fenced():
                raise LeaseLostError(self.run_id)
            # Refused: full, or paused (one read, on this waiting path only).
            if await self.store.limit_paused(key):
                raise LimitPausedDeferral(key, until_unpaused=True)
            await wakeups.wait(key, delay_s, self.clock)
            delay_s = min(LAST_POLL_S, delay_s * 2)
