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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from jobrun._core.clock import Clock
from jobrun._core.formats import add_milliseconds, format_instant
from jobrun.errors import JobValidationError, LeaseLostError

# A lost host's runs wait about a minute; renewed every 15 s, a pass survives an
# event loop stalled for 45 s. See docs/design.md, "The lease's life".
DEFAULT_LEASE_MS = 60 * 1000
MIN_LEASE_MS = 100
DEFAULT_MAX_TAKEOVERS = 5


def check_lease_ms(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"lease_ms must be an int, got {type(value).__name__}")
    if value < MIN_LEASE_MS:
        raise JobValidationError(
            f"lease_ms must be at least {MIN_LEASE_MS}, got {value}",
            [{"path": "lease_ms", "message": f"below {MIN_LEASE_MS}"}],
        )
    return value


@dataclass(frozen=True, slots=True)
class Lease:
    """One claim of one run: the token every fenced write carries."""

    token: str
    driver: str
    lease_ms: int

    def expiry_after(self, instant_text: str) -> str:
        return add_milliseconds(instant_text, self.lease_ms)


class LeaseKeeper:
    """Renews a lease in the background while a pass runs, and stops the pass
    when the lease is gone.

    Renewal happens every quarter of the lease, so a pass survives three missed
    renewals in a row (an event loop stalled for most of the lease) before
    anyone may take its run over. A lost lease is sticky: once a renewal finds
    it gone or a fenced write is refused (``lose``), no step body starts again
    in this pass, and the pass's task is cancelled at its next ``await`` (a hung
    step included), which the keeper turns into ``LeaseLostError`` on the way
    out, like ``asyncio.timeout`` turns its own cancellation into a timeout.
    The waits are on the pass's clock, so a test clock drives renewal too.
    """

    def __init__(
        self,
        lease: Lease,
        clock: Clock,
        extend: Callable[[str], Awaitable[bool]],
        run_id: str = "",
    ) -> None:
        self._lease = lease
        self._clock = clock
        self._extend = extend
        self._run_id = run_id
        self._renewer: asyncio.Task[None] | None = None
        self._pass: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._cancelled_pass = False
        self._exiting = False
        self.lost = False

    def lose(self) -> None:
        """The lease is gone: stop this pass (sticky; safe to call more than once)."""
        self.lost = True
        if self._pass is not None and not self._exiting and not self._cancelled_pass:
            self._cancelled_pass = True
            self._pass.cancel(msg="jobrun: the lease of this pass was lost")

    async def __aenter__(self) -> LeaseKeeper:
        self._pass = asyncio.current_task()
        if self._pass is not None:
            self._cancelling = self._pass.cancelling()
        self._renewer = asyncio.create_task(self._renew_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: object,
    ) -> None:
        self._exiting = True
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
        interval_s = self._lease.lease_ms / 4000
        while not self.lost:
            await self._clock.sleep(interval_s)
            expires_at = self._lease.expiry_after(format_instant(self._clock.now()))
            try:
                if not await self._extend(expires_at):
                    self.lose()
            except Exception:
                # A failed renewal is not a lost lease: the next one may succeed,
                # and the fenced writes are what actually protect the run.
                continue
