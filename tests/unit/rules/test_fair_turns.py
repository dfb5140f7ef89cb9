"""The count that decides which claims go by age (``jobrun/_core/rules/fair_turns.py``), and that
a driver sends it: in one drive, and carried over from one drive to the next."""

from __future__ import annotations

from typing import Any

import pytest

import jobrun
from jobrun._api import SYSTEM_SOURCES
from jobrun._core.engine.drive import drive_due_jobs
from jobrun._core.engine.options import DriveOptions
from jobrun._core.model.records import ClaimRequest
from jobrun._core.rules.fair_turns import FAIR_EVERY, ClaimTurns
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import drive, start


def test_every_fair_every_th_claim_goes_by_age() -> None:
    turns = ClaimTurns()
    flags = [turns.next_by_age() for _ in range(3 * FAIR_EVERY)]
    assert [number + 1 for number, by_age in enumerate(flags) if by_age] == [
        FAIR_EVERY,
        2 * FAIR_EVERY,
        3 * FAIR_EVERY,
    ]
    assert turns.claims == 3 * FAIR_EVERY
    every_other = ClaimTurns(2)
    assert [every_other.next_by_age() for _ in range(4)] == [False, True, False, True]


@pytest.mark.parametrize("every", [0, -1, True, 2.0])
def test_a_bad_share_is_refused(every: Any) -> None:
    with pytest.raises((jobrun.JobValidationError, TypeError), match="every"):
        ClaimTurns(every)


class _Requests:
    """A store that remembers each claim request it was sent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[ClaimRequest] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, request: ClaimRequest) -> Any:
        self.requests.append(request)
        return await self.inner.claim(request)


async def test_run_due_jobs_counts_claims_across_calls_on_the_store() -> None:
    clock = FakeClock()
    store = _Requests(MemoryJobRunStore())
    registry = jobrun.JobRegistry()
    registry.register("m", "j", lambda p: jobrun.PassResult(done=True))
    for number in range(3 * FAIR_EVERY):
        await start(store.inner, clock, module_id="m", job="j", instance=f"i{number}")
    # Drives of 3 claims each: the FAIR_EVERY-th claim overall goes by age, not
    # the FAIR_EVERY-th of one drive (which a drive this small never reaches).
    for _ in range(FAIR_EVERY):
        await drive(store, registry, clock, limit=3)
    flags = [request.by_age for request in store.requests]
    assert len(flags) == 3 * FAIR_EVERY
    assert [number + 1 for number, by_age in enumerate(flags) if by_age] == [
        FAIR_EVERY,
        2 * FAIR_EVERY,
        3 * FAIR_EVERY,
    ]
    assert store.inner.claim_turns.claims == 3 * FAIR_EVERY


async def test_a_driver_with_its_own_count_leaves_the_store_s_alone() -> None:
    """As each worker driver does: its turns are its own, kept across its drives."""
    clock = FakeClock()
    store = _Requests(MemoryJobRunStore())
    registry = jobrun.JobRegistry()
    registry.register("m", "j", lambda p: jobrun.PassResult(done=True))
    for number in range(4):
        await start(store.inner, clock, module_id="m", job="j", instance=f"i{number}")
    turns = ClaimTurns(2)
    options = DriveOptions(limit=1, clock=clock)
    for _ in range(4):
        await drive_due_jobs(store, registry, options, SYSTEM_SOURCES, turns=turns)
    assert [request.by_age for request in store.requests] == [False, True, False, True]
    assert (turns.claims, store.inner.claim_turns.claims) == (4, 0)
