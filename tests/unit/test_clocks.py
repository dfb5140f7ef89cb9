"""The clocks a drive runs on: the database-aligned default, a clock passed in, a bare
wall clock."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, cast

import pytest

from jobrun._core.time.aligned import aligned_clock
from jobrun._core.time.clock import as_clock
from jobrun._system import SYSTEM_CLOCK
from jobrun.testing import FakeClock


class _Offsetting:
    """A store whose clock reads ``offset_s`` ahead of this host's."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    async def clock_offset_s(self) -> float:
        return self.offset_s


@pytest.mark.parametrize("offset_s", [1.0, 30.0, -30.0])
async def test_the_default_clock_follows_a_database_clock_a_second_or_more_away(
    offset_s: float,
) -> None:
    clock = await aligned_clock(_Offsetting(offset_s), None, SYSTEM_CLOCK)
    ahead_s = (clock.now() - SYSTEM_CLOCK.now()).total_seconds()
    assert abs(ahead_s - offset_s) < 0.5
    await clock.sleep(0)  # waits are this host's, unchanged
    with pytest.raises(TimeoutError):
        async with clock.timeout(0):
            # A real wait: the deadline of the system clock must cut it short.
            await clock.sleep(5)


async def test_a_database_clock_under_a_second_away_is_taken_as_this_hosts() -> None:
    assert await aligned_clock(_Offsetting(0.999), None, SYSTEM_CLOCK) is SYSTEM_CLOCK
    assert await aligned_clock(_Offsetting(-0.5), SYSTEM_CLOCK, SYSTEM_CLOCK) is SYSTEM_CLOCK


async def test_a_clock_passed_in_is_used_as_is_and_the_database_is_not_asked() -> None:
    fake = FakeClock()
    assert await aligned_clock(cast(Any, None), fake, SYSTEM_CLOCK) is fake
    wall = aligned_clock(cast(Any, None), lambda: fake.now() + timedelta(hours=1), SYSTEM_CLOCK)
    assert (await wall).now() == fake.now() + timedelta(hours=1)


class _RecordingClock:
    """A base clock that records what it is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, object]] = []

    def now(self) -> Any:
        raise AssertionError("the wall time must come from the callable")

    def monotonic(self) -> float:
        return 42.5

    async def sleep(self, seconds: float) -> None:
        self.asked.append(("sleep", seconds))

    def timeout(self, seconds: float | None) -> Any:
        self.asked.append(("timeout", seconds))
        return contextlib.nullcontext()


async def test_a_bare_wall_clock_borrows_everything_but_the_time_from_its_base() -> None:
    base = _RecordingClock()
    moment = FakeClock().now()
    clock = as_clock(lambda: moment, cast(Any, base))
    assert clock.now() == moment
    assert clock.monotonic() == 42.5
    await clock.sleep(3.5)
    clock.timeout(7.0)
    assert base.asked == [("sleep", 3.5), ("timeout", 7.0)]
    with pytest.raises(
        TypeError, match=r"^clock must be a Clock or a callable returning a datetime, got 5$"
    ):
        as_clock(cast(Any, 5), cast(Any, base))
