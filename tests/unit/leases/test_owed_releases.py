"""Lease releases a store failed to write, kept and sent again
(``jobrun/_core/leases/owed_releases.py``): in the order they failed, one per lease, and
never lost to a failure or a cancellation while they are sent (the drives that owe them are
in ``tests/contract/test_faults.py``)."""

from __future__ import annotations

import asyncio

import pytest

from jobrun._core.leases.owed_releases import OwedReleases
from jobrun._core.model.records import RunPatch


def _release(reason: str) -> RunPatch:
    return RunPatch("failed", None, "{}", 1, reason, "t", None, "t")


class _Store:
    """Records each patch sent; ``fail_on`` (a reason) raises ``error`` instead, once."""

    def __init__(self, fail_on: str | None = None, error: BaseException | None = None) -> None:
        self.sent: list[tuple[str, str | None, str]] = []
        self.fail_on = fail_on
        self.error = error

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        if patch.last_error == self.fail_on and self.error is not None:
            error, self.error = self.error, None
            raise error
        self.sent.append((run_id, patch.last_error, token))
        return True


async def test_releases_go_in_the_order_they_failed_and_a_later_one_for_a_lease_wins() -> None:
    owed = OwedReleases()
    owed.owe("a", _release("first"), "T1")
    owed.owe("b", _release("second"), "T2")
    owed.owe("a", _release("again"), "T1")
    owed.owe("a", _release("another lease"), "T9")
    assert len(owed) == 3
    store = _Store()
    assert await owed.settle(store) == 3
    assert store.sent == [("a", "again", "T1"), ("b", "second", "T2"), ("a", "another lease", "T9")]
    assert len(owed) == 0
    assert await owed.settle(store) == 0


async def test_a_failing_store_stops_the_round_and_keeps_what_it_did_not_take() -> None:
    owed = OwedReleases()
    for number in range(3):
        owed.owe(f"r{number}", _release(f"r{number}"), "T")
    store = _Store(fail_on="r1", error=OSError("disk full"))
    assert await owed.settle(store) == 1
    assert store.sent == [("r0", "r0", "T")]
    assert len(owed) == 2
    assert await owed.settle(store) == 2
    # The one that failed again failed last: it goes behind the one never tried.
    assert [reason for _run, reason, _token in store.sent] == ["r0", "r2", "r1"]


async def test_a_cancelled_send_keeps_its_release_and_the_cancellation_goes_on() -> None:
    owed = OwedReleases()
    owed.owe("r", _release("r"), "T")
    with pytest.raises(asyncio.CancelledError):
        await owed.settle(_Store(fail_on="r", error=asyncio.CancelledError()))
    assert len(owed) == 1
    store = _Store()
    assert await owed.settle(store) == 1
    assert store.sent == [("r", "r", "T")]
