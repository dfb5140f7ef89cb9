"""Lease releases a store failure kept from being written, sent again once it answers.

A pass gives its lease up in its last write: the failure record, or the
hand-back of a pass that was stopped. When the store fails that write (a full
disk, a dropped connection), nothing runs the run any more, yet it would stay
leased until the lease expires (a minute by default). The write is owed
instead: kept here and sent again before the driver's next claim on the store,
so the run is due again as soon as the store answers, not when the lease runs out.

A late write is fenced on its token like the first try: if someone else holds
the run by then (the lease expired and was taken over, or an operator acted),
it misses and is dropped. Either way it is sent until it applies or misses.

Who keeps them: each store object (``owed_releases``), the one thing every
``run_due_jobs`` call and every worker driver on a database shares for as long
as the host uses it; so the state lives as long as that handle and no longer,
and no process-wide table of stores is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from jobrun._core.model.records import RunPatch


class Patcher(Protocol):
    """The one write a release needs (every store of the port has it); named here so
    the port can keep the releases it owes without a circle back to itself."""

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class OwedRelease:
    """One fenced write that gives a run's lease up, not yet written."""

    run_id: str
    patch: RunPatch
    token: str


class OwedReleases:
    """The releases one store owes, in the order they failed."""

    def __init__(self) -> None:
        self._owed: dict[tuple[str, str], OwedRelease] = {}

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, run_id: str, patch: RunPatch, token: str) -> None:
        """Remember a release whose write failed (a later one for the same lease wins)."""
        self._owed[(run_id, token)] = OwedRelease(run_id, patch, token)

    async def settle(self, store: Patcher) -> int:
        """Send every owed release; stop at the first the store fails (it is kept).

        Returns how many were sent and answered (applied or missed). Costs
        nothing when nothing is owed, the usual case.
        """
        answered = 0
        while self._owed:
            key, owed = next(iter(self._owed.items()))
            # Taken out while in flight, so a sibling driver does not send it too.
            del self._owed[key]
            try:
                await store.patch(owed.run_id, owed.patch, owed.token)
            except BaseException as error:
                self._owed.setdefault(key, owed)
                if isinstance(error, Exception):
                    # Still failing: the claim that follows will say so.
                    return answered
                raise
            answered += 1
        return answered
