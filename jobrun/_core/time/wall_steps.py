"""Lease instants that a step of the wall clock cannot turn into a stolen lease.

A lease's expiry is wall-clock text (``next_attempt_at``), written by its holder
and compared by every claimer. On Postgres both happen on the database's clock
inside the statement (see ``jobrun.sql.statements``); on SQLite and in memory
every process of a store shares one host, so they happen on this host's wall
clock, which an NTP step or a resumed VM can move by minutes at once.

Each process therefore watches its wall clock against its monotonic clock: the
difference between the two (the *basis*) stays put while the wall clock only
runs, and jumps when it steps. Every basis seen within the memory (at least a
few leases long) is kept, and a lease decision uses the two extremes:

* whether a lease has expired is judged on the *earliest* basis: after a forward
  step the claimer still judges pre-step expiries on the time they were written
  in, and after a backward step it judges on the stepped (earlier) clock;
* an expiry is written on the *latest* basis: after a backward step a holder's
  renewal still writes an expiry ahead of every clock that has not stepped back.

So a step costs only liveness (a dead holder is taken over up to the step later,
for the memory's length), never a live lease. A process started after a step has
no earlier basis to remember: for that, each lease is also written on the host's
boot clock, which never steps (:func:`boot_instant`, revision 0010), and a claimer
of the same boot judges it there. The watch reads no time of its own: the caller
hands both in.
"""

from __future__ import annotations

import weakref
from datetime import datetime, timedelta
from typing import Any

from jobrun._core.model.records import BootInstant

# Wall against monotonic moves this little from slewing and reading one after the
# other; a bigger jump between two readings is a step.
STEP_TOLERANCE_S = 0.5
# How long a basis is remembered after it was last seen: several default leases,
# so every live lease has been renewed on the new basis before the old is forgotten.
STEP_MEMORY_S = 900.0


class StepWatch:
    """The bases (wall minus monotonic seconds) one clock has shown recently."""

    def __init__(self) -> None:
        # [monotonic seconds last seen, basis], oldest first.
        self._bases: list[list[float]] = []
        self._memory_s = STEP_MEMORY_S

    def instants(
        self, wall: datetime, monotonic_s: float, memory_s: float = 0.0
    ) -> tuple[datetime, datetime]:
        """(the instant to judge expiries by, the instant to count a new expiry from)
        for a reading of ``wall`` at ``monotonic_s``; ``memory_s``: remember bases at
        least this long (twice the longest lease in play)."""
        self._memory_s = max(self._memory_s, memory_s)
        basis = wall.timestamp() - monotonic_s
        bases = self._bases
        if bases and abs(basis - bases[-1][1]) < STEP_TOLERANCE_S:
            # No step: follow the slow drift, so slewing never adds a basis.
            bases[-1] = [monotonic_s, basis]
        else:
            bases.append([monotonic_s, basis])
        while len(bases) > 1 and monotonic_s - bases[0][0] > self._memory_s:
            del bases[0]
        earliest = min(seen[1] for seen in bases)
        latest = max(seen[1] for seen in bases)
        return wall - timedelta(seconds=basis - earliest), wall + timedelta(seconds=latest - basis)

    def stepped(self) -> bool:
        """Whether a step is still remembered (judging and writing differ)."""
        return len(self._bases) > 1


_WATCHES: weakref.WeakKeyDictionary[Any, StepWatch] = weakref.WeakKeyDictionary()
_UNWEAKABLE: dict[int, StepWatch] = {}


def watch_of(clock: object) -> StepWatch:
    """The one watch of ``clock`` in this process (made on first use)."""
    try:
        return _WATCHES.setdefault(clock, StepWatch())
    except TypeError:
        # A clock that takes no weak reference: kept by identity for the process's life.
        return _UNWEAKABLE.setdefault(id(clock), StepWatch())


def lease_instants(clock: Any, memory_s: float = 0.0) -> tuple[datetime, datetime]:
    """``clock``'s reading as (judge-expiry instant, write-expiry instant); see the module."""
    wall = clock.now()
    return watch_of(getattr(clock, "step_watch_key", clock)).instants(
        wall, clock.monotonic(), memory_s
    )


def boot_instant(clock: Any) -> BootInstant | None:
    """``clock``'s reading of this host's boot clock (``None``: it has none, as a clock
    whose wall time is not the host's has none; see ``SystemClock.boot_instant``)."""
    read = getattr(clock, "boot_instant", None)
    return None if read is None else read()
