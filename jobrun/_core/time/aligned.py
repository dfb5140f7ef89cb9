"""Time from the database's clock when the caller did not bring a clock of its own.

Lease expiries and due instants are compared across hosts, so a host whose clock
runs ahead would take live leases from healthy drivers, and a starter whose clock
runs ahead would write runs that no healthy driver sees due. With the default
clock, jobrun reads this host's system clock corrected by its measured offset
from the database's clock (``store.clock_offset_s``: measured on Postgres once a
minute, one round trip; zero on SQLite, which lives on one host). A clock passed
in explicitly (a ``FakeClock`` in tests) is the caller's time and is used as is.
The system clock itself is handed in (the core reads no time of its own).

An offset under ``CLOCK_TOLERANCE_S`` is taken as no offset: one round trip
measures it only to within that round trip, so two processes on one host would
otherwise each correct the same clock by a different error, and a run one of them
just started could look not yet due to the other.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from jobrun._core.time.clock import Clock, ClockLike, WaitsFromBase, as_clock

# Skew this small is measurement noise, and harmless against a lease of a minute.
CLOCK_TOLERANCE_S = 1.0


class _Offset(WaitsFromBase):
    """The system clock with its wall time moved by ``offset``; waits are unchanged."""

    real_time = True

    def __init__(self, system: Clock, offset: timedelta) -> None:
        super().__init__(system)
        self._offset = offset

    def now(self) -> datetime:
        return self._base.now() + self._offset


async def aligned_clock(store: Any, clock: ClockLike | None, system: Clock) -> Clock:
    """``clock`` as given, or (given none, or ``system`` itself) ``system`` aligned to
    the database's clock."""
    if clock is not None and clock is not system:
        return as_clock(clock, system)
    offset_s = await store.clock_offset_s()
    if abs(offset_s) < CLOCK_TOLERANCE_S:
        return system
    return _Offset(system, timedelta(seconds=offset_s))
