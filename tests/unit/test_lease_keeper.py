"""The lease keeper: losing the lease stops this pass once, and nothing after it; a
failed renewal is tried again."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from jobrun._core.lease import Lease, LeaseKeeper
from jobrun._system import SYSTEM_CLOCK
from jobrun.errors import LeaseLostError
from jobrun.testing import FakeClock


async def _extended(expires_at: str, now_at: str) -> bool:
    return True


def _keeper() -> LeaseKeeper:
    return LeaseKeeper(Lease("T", "d", 60_000), SYSTEM_CLOCK, _extended, "run-1")


async def test_losing_the_lease_twice_still_ends_the_pass_as_lost_not_cancelled() -> None:
    keeper = _keeper()
    reached: list[str] = []

    async def pass_that_loses_twice() -> None:
        async with keeper:
            keeper.lose()
            keeper.lose()
            # sleep: a suspension point inside the lost pass
            await asyncio.sleep(0)
            reached.append("after the loss")

    with pytest.raises(LeaseLostError) as caught:
        await pass_that_loses_twice()
    assert reached == [], "the pass went on past its next await"
    # The traceback says why the pass was cancelled.
    cause = caught.value.__cause__
    assert isinstance(cause, asyncio.CancelledError)
    assert cause.args == ("jobrun: the lease of this pass was lost",)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_pass_begun_under_a_pending_cancellation_still_ends_as_lost() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    # Caught, not uncancelled: the task carries one cancellation from before the pass.
    with contextlib.suppress(asyncio.CancelledError):
        # sleep: a suspension point where the pending cancellation lands
        await asyncio.sleep(0)
    assert task.cancelling() == 1
    keeper = _keeper()

    async def losing_pass() -> None:
        async with keeper:
            keeper.lose()
            # sleep: a suspension point inside the lost pass
            await asyncio.sleep(0)

    try:
        with pytest.raises(LeaseLostError):
            await losing_pass()
        assert task.cancelling() == 1, "the keeper took back only its own cancellation"
    finally:
        task.uncancel()


async def test_a_failed_renewal_is_retried_at_the_next_interval() -> None:
    calls: list[str] = []

    async def flaky_extend(expires_at: str, now_at: str) -> bool:
        calls.append(expires_at)
        if len(calls) == 1:
            raise OSError("database unreachable for a moment")
        return True

    clock = FakeClock(autojump=True)
    # A 1 s lease renews every 250 ms of the (virtual) clock.
    async with LeaseKeeper(Lease("T", "d", 1000), clock, flaky_extend, "run-1") as keeper:
        await clock.sleep(1.1)
    assert not keeper.lost
    assert calls == [
        "2026-01-01T00:00:01.250Z",
        "2026-01-01T00:00:01.500Z",
        "2026-01-01T00:00:01.750Z",
        "2026-01-01T00:00:02.000Z",
    ]


async def test_losing_the_lease_after_the_pass_ended_cancels_nothing() -> None:
    keeper = _keeper()
    async with keeper:
        pass
    keeper.lose()
    # The driver's task goes on: a cancellation here would raise CancelledError.
    await asyncio.sleep(0)
    assert keeper.lost
