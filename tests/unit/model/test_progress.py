"""Progress and rates of a run's counters, and spans of time as the CLI and console show them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

import jobrun
from jobrun._core.model.progress import Poll, progress_of, span
from jobrun.testing import FakeClock


def test_progress_needs_a_positive_total_however_small() -> None:
    assert progress_of({"total": 0.5, "done": 0.25}) == ("done", 0.25, 0.5)
    assert progress_of({"total": -1, "done": 0}) is None
    # Ties between other counters go to the later name, so the choice is stable.
    assert progress_of({"total": 10, "b": 4, "a": 4}) == ("b", 4, 10)


def test_a_rate_counts_a_new_counter_from_zero() -> None:
    before = jobrun.JobRun(
        id="r", module_id="m", job="j", instance="i", status="running", payload=None,
        cursor=None, counters={"objects": 4}, attempts=0, last_error=None,
        started_at=FakeClock().now(), updated_at=FakeClock().now(), next_attempt_at=None,
        ended_at=None,
    )  # fmt: skip
    after = replace(before, counters={"objects": 10, "pages": 3})
    assert Poll(before, at=10.0).follow(after, at=12.0).rates == {"objects": 3.0, "pages": 1.5}
    assert Poll(before, at=10.0).follow(after, at=9.0).rates == {}  # time ran back: no rate


def test_the_total_has_no_work_rate() -> None:
    before = jobrun.JobRun(
        id="r", module_id="m", job="j", instance="i", status="running", payload=None,
        cursor=None, counters={"done": 4, "total": 100}, attempts=0, last_error=None,
        started_at=FakeClock().now(), updated_at=FakeClock().now(), next_attempt_at=None,
        ended_at=None,
    )  # fmt: skip
    after = replace(before, counters={"done": 10, "total": 120})
    poll = Poll(before, at=10.0).follow(after, at=12.0)
    assert poll.rates == {"done": 3.0, "total": 10.0}
    assert poll.work_rates() == {"done": 3.0}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (0, "0s"),
        (45.9, "45s"),
        (-45, "-45s"),
        (59, "59s"),
        (60, "1m00s"),
        (723, "12m03s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (11100, "3h05m"),
        (86399, "23h59m"),
        (timedelta(days=2, hours=4, minutes=59), "2d04h"),
        (-timedelta(hours=3, minutes=5), "-3h05m"),
    ],
)
def test_a_span_is_the_two_largest_units(seconds: float | timedelta | None, text: str) -> None:
    assert span(seconds) == text
