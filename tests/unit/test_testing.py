"""The fake clock in jobrun.testing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from jobrun.testing import FakeClock


def test_starts_at_an_aware_instant_and_stands_still() -> None:
    clock = FakeClock()
    now = clock()
    assert now.tzinfo is not None
    assert now.utcoffset() == timedelta(0)
    assert clock() == now


def test_starts_where_told() -> None:
    start = datetime(2030, 6, 1, 12, tzinfo=UTC)
    assert FakeClock(start)() == start


def test_accepts_an_aware_start_in_another_zone() -> None:
    start = datetime(2030, 6, 1, 14, tzinfo=timezone(timedelta(hours=2)))
    assert FakeClock(start)() == datetime(2030, 6, 1, 12, tzinfo=UTC)


def test_refuses_a_naive_start() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        FakeClock(datetime(2030, 1, 1))


def test_advance_moves_the_clock_and_returns_the_new_time() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = FakeClock(start)
    assert clock.advance(seconds=5) == start + timedelta(seconds=5)
    assert clock() == start + timedelta(seconds=5)
    clock.advance(milliseconds=250)
    assert clock() == start + timedelta(seconds=5, milliseconds=250)
    clock.advance(seconds=1.5, milliseconds=1)
    assert clock() == start + timedelta(seconds=6, milliseconds=751)


def test_advancing_by_nothing_keeps_the_time() -> None:
    clock = FakeClock()
    before = clock()
    assert clock.advance() == before
    assert clock() == before


@pytest.mark.parametrize(("seconds", "milliseconds"), [(-1, 0), (0, -1), (-0.001, 5000)])
def test_refuses_to_go_backwards(seconds: float, milliseconds: float) -> None:
    clock = FakeClock()
    before = clock()
    with pytest.raises(ValueError, match="forward"):
        clock.advance(seconds=seconds, milliseconds=milliseconds)
    assert clock() == before
