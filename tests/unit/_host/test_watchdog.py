"""The watchdog ends the process when a step body outlives its kill instant, and only then."""

from __future__ import annotations

import threading
import time

from jobrun._host.system import SYSTEM_CLOCK
from jobrun._host.watchdog import CHECK_INTERVAL_S, Watchdog, real_time_guard
from jobrun.testing import FakeClock


def _watchdog() -> tuple[Watchdog, threading.Event, list[str]]:
    ended = threading.Event()
    reasons: list[str] = []

    def end(reason: str) -> None:
        reasons.append(reason)
        ended.set()

    return Watchdog(end), ended, reasons


def test_a_body_past_its_deadline_ends_the_process() -> None:
    watchdog, ended, reasons = _watchdog()
    watchdog.enter(lambda: time.monotonic() - 0.001)
    assert ended.wait(5), "the watchdog acted"
    assert "still running" in reasons[0]


def test_a_body_that_ends_in_time_is_left_alone() -> None:
    watchdog, ended, _ = _watchdog()
    entered = watchdog.enter(lambda: time.monotonic() + 60)
    # A wait for something that must not happen: ten of the watchdog's looks.
    assert not ended.wait(CHECK_INTERVAL_S * 10)
    watchdog.leave(entered)
    assert watchdog.in_flight() == 0


def test_a_deadline_moved_by_a_renewal_is_read_again() -> None:
    watchdog, ended, _ = _watchdog()
    deadline = [time.monotonic() + 60]
    entered = watchdog.enter(lambda: deadline[0])
    assert not ended.wait(CHECK_INTERVAL_S * 5)
    deadline[0] = time.monotonic() - 1  # the lease could not be renewed after all
    assert ended.wait(5)
    watchdog.leave(entered)


def test_only_passes_on_real_time_are_watched() -> None:
    assert real_time_guard(SYSTEM_CLOCK) is not None
    assert real_time_guard(FakeClock()) is None
