"""Fair claims: a fixed share of a driver's claims goes by age, not priority.

Claims normally take the due run of highest priority; alone, that lets a steady
stream of higher-priority runs keep a low-priority one waiting forever. So one
claim in :data:`FAIR_EVERY` ignores priority and takes the due run that has been
due longest (due instant, then id; ``ClaimRequest.by_age``). Everything else
about that claim is the same: orphans first, per-job limits, the runs this drive
already had, the jobs asked for.

Which claims go by age is counted here, by the driver (:class:`ClaimTurns`),
never by the store: no clock, no randomness, the same answer on every backend.

The bound (see ``docs/design.md``, "Fair claims"): a due run ``R`` of a job a
driver asks for, whose job is below its limit, is claimed by the time that
driver has made ``FAIR_EVERY * (k + 1)`` claims, where ``k`` is how many passes
the runs due before it (due instant, then id) still take, plus orphans taken
meanwhile. Runs that arrive later are due later, so they never add to ``k``,
whatever their priority.
"""

from __future__ import annotations

from jobrun._core.model.refusals import checked_positive_int

FAIR_EVERY = 8
"""One claim in this many goes by age (the 8th, 16th, ... claim of a driver)."""


class ClaimTurns:
    """A driver's count of its claims: every ``every``-th goes by age.

    Kept by whoever claims repeatedly: each worker driver has its own, and
    :func:`jobrun.run_due_jobs` calls share the store's (``claim_turns``), so
    the count carries over from one call to the next however small ``limit`` is.
    """

    def __init__(self, every: int = FAIR_EVERY) -> None:
        self.every = checked_positive_int(every, "every")
        self.claims = 0

    def next_by_age(self) -> bool:
        """Count one more claim; whether it is one that goes by age."""
        self.claims += 1
        return self.claims % self.every == 0
