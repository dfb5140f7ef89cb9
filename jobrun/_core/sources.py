"""What the core is handed from the machine: chosen once, above the core, and passed in.

The core reads no real source itself: no clock, no entropy, no ``/proc``, no
process id. ``jobrun._api`` builds one :class:`Sources` from ``jobrun._host.system``
and hands it to every core function that needs one, the way an event loop
library chooses its clock once; a test can hand in another. A public operation
that needs one takes it first, positional only, before its public signature
(``start_job_run(sources, /, store, *, ...)``); ``jobrun._api`` binds it to the
real sources, so the signature and docstring are written once, here in the core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobrun._core.leases.holders import Host
from jobrun._core.leases.renewal import BodyGuard
from jobrun._core.time.clock import Clock, ClockLike, as_clock


@dataclass(frozen=True, slots=True)
class Sources:
    """The machine as the core sees it.

    * ``clock``: the system clock, the time of every call given no ``clock=``
      (aligned to the database's clock where the call reads the database).
    * ``mint_id``: a new run id or lease token (a ULID) per call.
    * ``random``: retry jitter, floats in [0, 1), where a drive was given none.
    * ``host``: this process's identity, and its view of other processes.
    * ``driver_name``: how leases name a driver that was given no name.
    * ``guard``: the watchdog for passes on a clock (``None``: that clock is not
      real time, so nothing is watched).
    """

    clock: Clock
    mint_id: Callable[[], str]
    random: Callable[[], float]
    host: Host
    driver_name: Callable[[], str]
    guard: Callable[[Clock], BodyGuard | None]

    def clock_for(self, clock: ClockLike | None) -> Clock:
        """The clock a caller chose, or the system clock when it chose none."""
        return self.clock if clock is None else as_clock(clock, self.clock)
