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
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from jobrun._core.clock import Clock
from jobrun._core.formats import add_milliseconds, format_instant
from jobrun.errors import JobValidationError

DEFAULT_LEASE_MS = 15 * 60 * 1000
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
    """Renews a lease in the background while a pass runs.

    Renewal happens every quarter of the lease, so a pass survives three missed
    renewals in a row before anyone may take its run over. When a renewal finds
    the lease gone, ``lost`` is set and the pass stops at its next step. The
    waits are on the pass's clock, so a test clock drives renewal too.
    """

    def __init__(
        self,
        lease: Lease,
        clock: Clock,
        extend: Callable[[str], Awaitable[bool]],
    ) -> None:
        self._lease = lease
        self._clock = clock
        self._extend = extend
        self._task: asyncio.Task[None] | None = None
        self.lost = False

    async def __aenter__(self) -> LeaseKeeper:
        self._task = asyncio.create_task(self._renew_forever())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _renew_forever(self) -> None:
        interval_s = self._lease.lease_ms / 4000
        while not self.lost:
            await self._clock.sleep(interval_s)
            expires_at = self._lease.expiry_after(format_instant(self._clock.now()))
            try:
                if not await self._extend(expires_at):
                    self.lost = True
            except Exception:
                # A failed renewal is not a lost lease: the next one may succeed,
                # and the fenced writes are what actually protect the run.
                continue
