"""Time from the database's clock when the caller did not bring a clock of its own.

Lease expiries and due instants are compared across hosts, so a host whose clock
runs ahead would take live leases from healthy drivers, and a starter whose clock
runs ahead would write runs that no healthy driver sees due. With the default
clock, jobrun reads this host's system clock corrected by its measured offset
from the database's clock (``store.clock_offset_s``: measured on Postgres once a
minute, one round trip; zero on SQLite, which lives on one host). A clock passed
in explicitly (a ``FakeClock`` in tests) is the caller's time and is used as is.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from jobrun._core.formats import Clock, system_clock
from jobrun._core.port import JobRunStore


async def aligned_clock(store: JobRunStore, clock: Clock) -> Clock:
    if clock is not system_clock:
        return clock
    offset = timedelta(seconds=await store.clock_offset_s())
    if not offset:
        return system_clock

    def database_clock() -> datetime:
        return system_clock() + offset

    return database_clock
