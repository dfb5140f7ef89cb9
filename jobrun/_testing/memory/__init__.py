"""``MemoryJobRunStore``, public as ``jobrun.testing.MemoryJobRunStore`` (whose module
says what it promises).

Cut as the SQL store is (``jobrun/sql/store/``): one class per facet of the port
(:mod:`jobrun._core.port`), each in its own file beside this one, over the tables
they share (:mod:`~jobrun._testing.memory.base`): runs, claims, leases, limits,
operator, pauses, schedules, browse. This class is the facets put together: its
constructor and the properties every drive shares.
"""

from __future__ import annotations

from jobrun._core import Clock, KeptForDrives, StoreLimits
from jobrun._host import SYSTEM_CLOCK
from jobrun._testing.memory.browse import MemoryBrowse
from jobrun._testing.memory.claims import MemoryClaims
from jobrun._testing.memory.leases import MemoryLeases
from jobrun._testing.memory.limits import MemoryLimits
from jobrun._testing.memory.operator import MemoryOperator
from jobrun._testing.memory.pauses import MemoryPauses
from jobrun._testing.memory.runs import MemoryRuns
from jobrun._testing.memory.schedules import MemorySchedules

__all__ = ["MemoryJobRunStore"]


class MemoryJobRunStore(
    MemoryRuns,
    MemoryClaims,
    MemoryLeases,
    MemoryLimits,
    MemoryOperator,
    MemoryPauses,
    MemorySchedules,
    MemoryBrowse,
    KeptForDrives,
):
    """The store port in a dict, for tests: pass it wherever a store is asked for.

    It keeps the same contract as ``SqlJobRunStore`` (one live run per key,
    fenced writes, the ledger dropped with the pass commit). Every operation
    completes without yielding, so each is atomic with respect to other tasks on
    the loop. ``default_scope`` is what ``await p.scope()`` returns in passes
    driven without an ``open_scope``. ``clock`` is what this "database" refills
    rate-limit buckets by (default: the system clock; a ``FakeClock`` in tests).
    """

    def __init__(
        self,
        limits: StoreLimits | None = None,
        default_scope: object = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        KeptForDrives.__init__(self, limits or StoreLimits(), default_scope)
        self._clock = SYSTEM_CLOCK if clock is None else clock
        self.runs = {}
        self.ledgers = {}
        self.buckets = {}
        self.cooling = {}
        self.slots = set()
        self.schedules = {}
        self.retention = {}
        self.workers = {}
        self.job_pauses = {}
        self.limit_pauses = {}
