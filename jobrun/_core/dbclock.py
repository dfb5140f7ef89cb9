"""Time from the database's clock when the caller did not bring a clock of its own.

Lease expiries and due instants are compared across hosts, so a host whose clock
runs ahead would take live leases from healthy drivers, and a starter whose clock
runs ahead would write runs that no healthy driver sees due. With the default
clock, jobrun reads this host's system clock corrected by its measured offset
from the database's clock (``store.clock_offset_s``: measured on Postgres once a
minute, one round trip; zero on SQLite, which lives on one host). A clock passed
in explicitly (a ``FakeClock`` in tests) is the caller's time and is used as is.

An offset under ``CLOCK_TOLERANCE_S`` is taken as no offset: one round trip
measures it only to within that round trip, so two processes on one host would
otherwise each correct the same clock by a different error, and a run one of them
just started could look not yet due to the other.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from jobrun._core.formats import Clock, system_clock
from jobrun._core.port import JobRunStore

# Skew this small is measurement noise, and harmless against a lease of a minute.
CLOCK_TOLERANCE_S = 1.0


async def aligned_clock(store: JobRunStore, clock: Clock) -> Clock:
    if clock is not system_clock:
        return clock
    offset_s = await store.clock_offset_s()
    if abs(offset_s) < CLOCK_TOLERANCE_S:
        return system_clock
    offset = timedelta(seconds=offset_s)

    def database_clock() -> datetime:
        return system_clock() + offset

    return database_clock
