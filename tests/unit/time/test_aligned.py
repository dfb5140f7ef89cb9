"""The clock a drive runs on: aligned with the database's by default, or the one passed in
(a bare wall clock made whole is in ``test_clock.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from jobrun._core.time.aligned import aligned_clock
from jobrun._host.system import SYSTEM_CLOCK
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
