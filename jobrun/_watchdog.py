"""The watchdog: ends this process before a step body it cannot stop outlives its lease.

The lease keeper stops a pass by cancelling it, which reaches an ``async`` body at
its next ``await``. Some bodies it cannot reach: a blocking call that holds the
event loop, a body that swallows ``CancelledError``, a process woken from
SIGSTOP past its lease. For those the keeper's fence is a promise it cannot
keep from inside the loop, so a thread outside it watches every body in flight
and, when one is still running at its pass's kill instant (half the stop margin
before the earliest takeover), ends the process with SIGKILL, as if the machine
had lost it: the pass is lost, its finished steps are not, and since the
process is gone other drivers take its runs over at once.

It watches real time only: a pass on a test clock is not watched. Opt out with
``watchdog=False`` (``run_due_jobs``, ``run_worker``) or ``jobrun worker
--no-watchdog``; then such a body may overlap the next holder's (see
``docs/design.md``, "Self-fencing").
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from jobrun._core.clock import Clock

log = logging.getLogger("jobrun.watchdog")

# How often the thread looks: the most a body can outlive its kill instant by
# (plus the wait for the GIL, a switch interval: 5 ms by default).
CHECK_INTERVAL_S = 0.02


def _kill_this_process(reason: str) -> None:
    # Written straight to stderr first: logging handlers may need the blocked loop.
    sys.stderr.write(f"jobrun watchdog: {reason}; ending the process (SIGKILL)\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Watchdog:
    """Bodies in flight and their kill instants, watched by one daemon thread."""

    def __init__(self, end: Callable[[str], None] = _kill_this_process) -> None:
        self._end = end
        self._lock = threading.Lock()
        self._bodies: dict[int, Callable[[], float]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def enter(self, deadline_s: Callable[[], float]) -> object:
        """A body started that must end before ``deadline_s()`` (``time.monotonic``)."""
        with self._lock:
            self._next += 1
            number = self._next
            self._bodies[number] = deadline_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="jobrun-watchdog", daemon=True
                )
                self._thread.start()
        return number

    def leave(self, entered: object) -> None:
        with self._lock:
            self._bodies.pop(entered, None)  # type: ignore[call-overload]

    def in_flight(self) -> int:
        with self._lock:
            return len(self._bodies)

    def _watch(self) -> None:
        while True:
            time.sleep(CHECK_INTERVAL_S)
            with self._lock:
                deadlines = list(self._bodies.values())
            now_s = time.monotonic()
            late = [deadline() for deadline in deadlines if now_s >= deadline()]
            if late:
                self._end(
                    f"a step body was still running {now_s - min(late):.3f} s past the "
                    "instant its lease could be taken over (a blocking call, a body that "
                    "ignores cancellation, or a process stopped past its lease)"
                )
                return


WATCHDOG = Watchdog()


def real_time_guard(clock: Clock) -> Watchdog | None:
    """The process's watchdog for passes on ``clock``, if it runs on real time."""
    return WATCHDOG if getattr(clock, "real_time", False) else None
