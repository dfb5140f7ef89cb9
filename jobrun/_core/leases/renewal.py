"""Leases: how many drivers share one database without running a pass twice.

A driver *claims* a due run right before its pass: one conditional write sets a
fresh fencing token (``lease_owner``), who holds it (``lease_driver``), when the
pass began (``lease_began_at``) and pushes ``next_attempt_at`` to the lease's
expiry. Because the expiry sits in ``next_attempt_at``, a run whose driver died
becomes due again when the lease runs out, and the ordinary claim picks it up:
no reaper, no extra index.

Every write the holder makes afterwards is fenced on ``status = 'running' AND
lease_owner = <token>``. A write that matches nothing means the lease was lost
(expired and taken over, or an operator cancelled or released the run): the
pass stops at that boundary and its outcome is ``superseded``.

A fence only refuses writes; the bodies themselves must stop too, before anyone
may take the run over. So the holder fences itself: it knows, on its own
monotonic clock, the last instant before which no other driver may take the run
(the send of its last successful claim or renewal plus the lease, less the clock
skew the store tolerates), and past ``safe_until_s - stop_margin_s`` it starts no
body and cancels those in flight; it does the same the moment its presence is
lost (see ``jobrun._core.leases.proof_of_death``). An expired lease is never renewed: the
renewal is conditional on the lease not having expired.

A renewal proves that the store answers the renewer, not that the pass can go
on: a pass waiting on a connection that went silent would be renewed forever.
So the pass's store calls are bounded by its fence: the keeper knows when each
call in flight began (``calls``), and renews nothing while one has been in
flight for a renewal interval or more; the fence then comes, the pass is
cancelled where it waits, and the call is abandoned (the executor discards its
connection). See docs/design.md, "A store call that never answers".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.refusals import checked_int, refuse
from jobrun._core.time.aligned import CLOCK_TOLERANCE_S
from jobrun._core.time.clock import Clock
from jobrun._core.time.wall_steps import lease_instants
from jobrun.errors import LeaseLostError

# A lost host's runs wait about a minute; renewed every 15 s, a pass survives an
# event loop stalled for 45 s. See docs/design.md, "The lease's life".
DEFAULT_LEASE_MS = 60 * 1000
MIN_LEASE_MS = 100
DEFAULT_MAX_TAKEOVERS = 5

T = TypeVar("T")

# The least real time a write that only serves liveness (an outcome write, a
# hand-back, a call of the drive outside a pass) is given before it is abandoned
# as unanswered: a short lease on a loaded machine must not turn slow answers
# into errors, and a drive on a test clock is not hurried by it.
CALL_FLOOR_S = 10.0


def check_lease_ms(value: object) -> int:
    lease_ms = checked_int(value, "lease_ms")
    if lease_ms < MIN_LEASE_MS:
        raise refuse(
            "lease_ms",
            f"below {MIN_LEASE_MS}",
            message=f"lease_ms must be at least {MIN_LEASE_MS}, got {lease_ms}",
        )
    return lease_ms


@dataclass(frozen=True, slots=True)
class Lease:
    """One claim of one run: the token every fenced write carries, and the
    presence (Postgres) that vouches for its holder."""

    token: str
    driver: str
    lease_ms: int
    presence: int | None = None
    # The presence connection's socket, for the watchdog (see ``BodyGuard``).
    presence_fd: int | None = None

    def expiry_after(self, instant_text: str) -> str:
        return add_milliseconds(instant_text, self.lease_ms)

    def skew_margin_s(self) -> float:
        """How much earlier than its own clock says another driver may see this
        lease expire: two clocks each off by up to ``CLOCK_TOLERANCE_S`` (the
        alignment to the database's clock ignores less), or a quarter of a short
        lease (shorter leases assume clocks closer than an eighth of it each)."""
        return min(2 * CLOCK_TOLERANCE_S, self.lease_ms / 4000)

    def renew_interval_s(self) -> float:
        """How often the holder renews: a quarter of the lease. Also how long a store
        call of the pass may stay unanswered before the holder stops renewing."""
        return self.lease_ms / 4000

    def stop_margin_s(self) -> float:
        """How long before the takeover instant the holder stops its bodies: an
        eighth of the lease, at most a second (the cancellation's way to a body)."""
        return min(1.0, self.lease_ms / 8000)


class BodyGuard(Protocol):
    """What ends a body that cannot be cancelled (a blocking call, a process
    woken from SIGSTOP) before another driver may take its run: a watchdog
    outside the event loop. ``enter`` says a body started that must end before
    ``deadline_s()`` (monotonic seconds, re-read as renewals move it), and soon
    after the server closes ``socket_fd`` (the presence that vouches for it);
    ``leave`` with what ``enter`` returned says it ended."""

    def enter(self, deadline_s: Callable[[], float], socket_fd: int | None = None) -> object: ...

    def leave(self, entered: object) -> None: ...


class LeaseKeeper:
    """Renews a lease in the background while a pass runs, and stops the pass
    when the lease is gone or can no longer be vouched for.

    Renewal happens every quarter of the lease, so a pass survives missed
    renewals for most of the lease. A lost lease is sticky: once a renewal finds
    it gone, a fenced write is refused (``lose``), the holder's presence is lost,
    or the self-fence instant passes without a renewal, no step body starts
    again in this pass, and the pass's task is cancelled at its next ``await``
    (a hung step included), which the keeper turns into ``LeaseLostError`` on
    the way out, like ``asyncio.timeout`` turns its own cancellation into a
    timeout. The waits are on the pass's clock, so a test clock drives them too.
    """

    def __init__(
        self,
        lease: Lease,
        clock: Clock,
        extend: Callable[[str, str], Awaitable[bool]],
        run_id: str = "",
        *,
        leased_at_s: float | None = None,
        watch_presence: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
        guard: BodyGuard | None = None,
    ) -> None:
        self._lease = lease
        # Fixed for the keeper's life; read by fenced() before every step body.
        self._stop_margin_s = lease.stop_margin_s()
        self._clock = clock
        self._extend = extend
        self._run_id = run_id
        sent_s = clock.monotonic() if leased_at_s is None else leased_at_s
        self.safe_until_s = self._safe_after(sent_s)
        self._watch_presence = watch_presence
        self._unwatch: Callable[[], None] | None = None
        self.guard = guard
        self._renewer: asyncio.Task[None] | None = None
        self._pass: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._cancelled_pass = False
        self._exiting = False
        self.lost = False
        self.refused = False
        # When each store call of the pass now in flight began (monotonic, oldest
        # first): the step path appends and removes its own instant, no timer.
        self.calls: list[float] = []

    @property
    def lease(self) -> Lease:
        """The lease this keeper renews (its token fences every write of the pass)."""
        return self._lease

    def _safe_after(self, sent_s: float) -> float:
        """The last instant no other driver may take over, for a lease written by a
        request sent at ``sent_s`` (the write happened after it was sent)."""
        return sent_s + self._lease.lease_ms / 1000 - self._lease.skew_margin_s()

    def stop_at_s(self) -> float:
        """When this holder stops its bodies unless a renewal moves it on."""
        return self.safe_until_s - self._stop_margin_s

    @property
    def presence_fd(self) -> int | None:
        return self._lease.presence_fd

    def kill_at_s(self) -> float:
        """When the watchdog ends the process if a body it cannot stop still runs:
        half the stop margin before the earliest takeover."""
        return self.safe_until_s - self._lease.stop_margin_s() / 2

    def fenced(self) -> bool:
        """Whether no step body may start now: the lease is lost, or past the self-fence."""
        if not self.lost and self._clock.monotonic() >= self.safe_until_s - self._stop_margin_s:
            self.lose()
        return self.lost

    def lose(self, refused: bool = False) -> None:
        """The lease is gone (``refused``: a fenced write proved another holds it), or
        can no longer be vouched for: stop this pass (sticky; safe to call more than once)."""
        self.refused = self.refused or refused
        self.lost = True
        if self._pass is not None and not self._exiting and not self._cancelled_pass:
            self._cancelled_pass = True
            self._pass.cancel(msg="jobrun: the lease of this pass was lost")

    def stalled(self, now_s: float) -> bool:
        """Whether a store call of the pass has been in flight a renewal interval or
        more: the pass cannot go on, so the lease is not renewed (the fence comes)."""
        calls = self.calls
        return bool(calls) and now_s - calls[0] >= self._lease.renew_interval_s()

    async def call(self, awaitable: Awaitable[T]) -> T:
        """Await a store call of the pass, known to the keeper while in flight."""
        started = self._clock.monotonic()
        self.calls.append(started)
        try:
            return await awaitable
        finally:
            self.calls.remove(started)

    def write_deadline_s(self) -> float:
        """How long an outcome write (commit, failure, deferral) may take, from now,
        in real seconds: until the fence, or ``CALL_FLOOR_S`` if the fence is nearer.
        Its safety rests on the token, not on the fence (no body runs after the
        handler); the bound is for liveness, so a silent connection cannot hold the run."""
        left_s = self.stop_at_s() - self._clock.monotonic()
        return max(left_s, CALL_FLOOR_S)

    async def __aenter__(self) -> LeaseKeeper:
        self._pass = asyncio.current_task()
        if self._pass is not None:
            self._cancelling = self._pass.cancelling()
        if self._watch_presence is not None:
            # Called at once if the presence that vouched for the claim is gone already.
            self._unwatch = self._watch_presence(self.lose)
        self._renewer = asyncio.create_task(self._renew_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: object,
    ) -> None:
        self._exiting = True
        if self._unwatch is not None:
            self._unwatch()
        interrupted: BaseException | None = exc
        if self._renewer is not None:
            self._renewer.cancel()
            try:
                # A real suspension: a cancellation still pending on this task lands here.
                await asyncio.wait({self._renewer})
            except asyncio.CancelledError as error:
                interrupted = error
        if self._cancelled_pass and self._pass is not None:
            if self._pass.uncancel() > self._cancelling:
                # Someone else cancelled the pass too: their cancellation goes on.
                if isinstance(interrupted, asyncio.CancelledError):
                    raise interrupted
                raise asyncio.CancelledError
        elif interrupted is not exc and interrupted is not None:
            raise interrupted
        if self.lost:
            # Even if the handler swallowed every error: the pass ends superseded.
            raise LeaseLostError(self._run_id) from interrupted

    async def _renew_forever(self) -> None:
        interval_s = self._lease.renew_interval_s()
        while not self.fenced():
            # Every interval, or at the self-fence if that comes first.
            await self._clock.sleep(min(interval_s, self.stop_at_s() - self._clock.monotonic()))
            if self.fenced():
                return
            if self.stalled(self._clock.monotonic()):
                # Renewal is not proof of life of the pass: one of its store calls
                # has gone unanswered, so the fence is left to come.
                continue
            # Read together: the new expiry is counted from ``written``; the local
            # fence from ``sent_s``, on the monotonic clock, which no step moves.
            sent_s = self._clock.monotonic()
            judged, written = lease_instants(self._clock, self._lease.lease_ms / 500)
            now_at = format_instant(judged)
            expires_at = self._lease.expiry_after(format_instant(written))
            try:
                # A renewal that hangs (a network gone quiet) must not hold up the fence.
                async with self._clock.timeout(max(0.0, self.stop_at_s() - sent_s)):
                    renewed = await self._extend(expires_at, now_at)
            except Exception:
                # A failed renewal is not a lost lease: the next one may succeed.
                # Until one does, the self-fence instant stays where it was.
                continue
            if not renewed:
                self.lose(refused=True)
                return
            self.safe_until_s = max(self.safe_until_s, self._safe_after(sent_s))
