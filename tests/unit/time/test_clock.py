"""A bare wall clock made a whole clock: the time from the callable, the waits from its base."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import pytest

from jobrun._core.time.clock import as_clock
from jobrun.testing import FakeClock


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
