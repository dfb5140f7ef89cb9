"""The lease keeper: losing the lease stops this pass once, and nothing after it; a
failed renewal is tried again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from jobrun._core.leases.renewal import Lease, LeaseKeeper
from jobrun._core.time.aligned import CLOCK_TOLERANCE_S
from jobrun._host.system import SYSTEM_CLOCK
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


def test_the_margins_of_a_lease() -> None:
    # Two clocks each off by up to the tolerance, or a quarter of a short lease.
    assert Lease("T", "d", 60_000).skew_margin_s() == 2 * CLOCK_TOLERANCE_S
    assert Lease("T", "d", 1000).skew_margin_s() == 0.25


def test_the_safe_instant_counts_from_when_the_claim_was_sent() -> None:
    clock = FakeClock()
    lease = Lease("T", "d", 60_000)
    sent_s = clock.monotonic() - 10
    keeper = LeaseKeeper(lease, clock, _extended, "run-1", leased_at_s=sent_s)
    assert keeper.safe_until_s == sent_s + 60 - lease.skew_margin_s()
    assert keeper.stop_at_s() == keeper.safe_until_s - lease.stop_margin_s()
    # The watchdog acts half a stop margin before the earliest takeover.
    assert keeper.kill_at_s() == keeper.safe_until_s - lease.stop_margin_s() / 2


async def test_a_lost_presence_ends_the_pass_as_lost_not_refused() -> None:
    watched: list[Callable[[], None]] = []
    unwatched: list[str] = []

    def watch_presence(on_lost: Callable[[], None]) -> Callable[[], None]:
        watched.append(on_lost)
        return lambda: unwatched.append("unwatched")

    keeper = LeaseKeeper(
        Lease("T", "d", 60_000), SYSTEM_CLOCK, _extended, "run-7", watch_presence=watch_presence
    )

    async def pass_whose_presence_is_lost() -> None:
        async with keeper:
            (on_lost,) = watched
            on_lost()
            # sleep: a suspension point inside the lost pass
            await asyncio.sleep(0)

    with pytest.raises(LeaseLostError) as caught:
        await pass_whose_presence_is_lost()
    assert caught.value.run_id == "run-7"
    assert (keeper.lost, keeper.refused) == (True, False)
    assert unwatched == ["unwatched"]


def test_a_refusal_stays_known_after_a_later_plain_loss() -> None:
    keeper = _keeper()
    assert (keeper.lost, keeper.refused) == (False, False)
    keeper.lose(refused=True)
    keeper.lose()
    assert (keeper.lost, keeper.refused) == (True, True)


async def test_a_lease_lost_before_the_pass_began_ends_it_as_lost() -> None:
    keeper = _keeper()
    keeper.lose()
    with pytest.raises(LeaseLostError):
        async with keeper:
            pass


async def _failing_extend(expires_at: str, now_at: str) -> bool:
    raise OSError("database unreachable")


async def _hanging_extend(expires_at: str, now_at: str) -> bool:
    await asyncio.Event().wait()
    return True


@pytest.mark.parametrize("extend", [_failing_extend, _hanging_extend], ids=["fails", "hangs"])
async def test_without_renewals_the_pass_stops_at_the_self_fence_instant(
    extend: Callable[[str, str], Awaitable[bool]],
) -> None:
    clock = FakeClock(autojump=True)
    # A 1 s lease: renewals every 250 ms, the self-fence at 0.625 s (not on an interval).
    keeper = LeaseKeeper(Lease("T", "d", 1000), clock, extend, "run-1")
    stop_at_s = keeper.stop_at_s()
    with pytest.raises(LeaseLostError):
        async with keeper:
            await clock.sleep(10)
    assert clock.monotonic() == pytest.approx(stop_at_s)
    assert (keeper.lost, keeper.refused) == (True, False)
