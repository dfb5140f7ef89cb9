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

A lost presence (Postgres) is the other instant it keeps: another host may take
the runs over ``PRESENCE_GRACE_S`` after the session ended, and a blocked event
loop cannot run the presence check that would stop its bodies. So for a body
vouched for by a presence, the thread also watches that connection's socket;
once the server has closed it (``pg_terminate_backend``, an idle timeout, a
restart), the body must end within ``HANGUP_KILL_S``, comfortably inside the
grace. A loop that runs notices the same close within half a second and
cancels the body itself; only a blocked one reaches the kill.

It watches real time only: a pass on a test clock is not watched. It is on in
``run_worker`` and ``jobrun worker`` unless ``watchdog=False`` / ``--no-watchdog``,
and in ``run_due_jobs`` only with ``watchdog=True`` (that runs in a host's
process); without it such a body may overlap the next holder's (see
``docs/design.md``, "Self-fencing").
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobrun._core.leases.proof_of_death import PRESENCE_GRACE_S
from jobrun._core.time.clock import Clock

log = logging.getLogger("jobrun.watchdog")

# How often the thread looks: the most a body can outlive its kill instant by
# (plus the wait for the GIL, a switch interval: 5 ms by default).
CHECK_INTERVAL_S = 0.02
# After its presence's socket was closed by the server, how long a body may run on.
HANGUP_KILL_S = PRESENCE_GRACE_S - 1.0
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


@dataclass(slots=True)
class _Body:
    deadline_s: Callable[[], float]
    socket_fd: int | None
    hung_up_at_s: float | None = None

    def kill_at_s(self, now_s: float) -> float:
        if self.socket_fd is not None and self.hung_up_at_s is None and _hung_up(self.socket_fd):
            self.hung_up_at_s = now_s
        if self.hung_up_at_s is None:
            return self.deadline_s()
        return min(self.deadline_s(), self.hung_up_at_s + HANGUP_KILL_S)


def _hung_up(socket_fd: int) -> bool:
    """Whether the peer closed ``socket_fd`` (read without consuming anything)."""
    poller = select.poll()
    poller.register(socket_fd, _HANGUP)
    return any(events & _HANGUP for _, events in poller.poll(0))


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
        self._bodies: dict[int, _Body] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def enter(self, deadline_s: Callable[[], float], socket_fd: int | None = None) -> object:
        """A body started that must end before ``deadline_s()`` (``time.monotonic``),
        and within ``HANGUP_KILL_S`` of the server closing ``socket_fd`` (its presence)."""
        with self._lock:
            self._next += 1
            number = self._next
            self._bodies[number] = _Body(deadline_s, socket_fd)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="jobrun-watchdog", daemon=True
                )
                self._thread.start()
        return number

    def leave(self, entered: object) -> None:
        with self._lock:
            if isinstance(entered, int):
                self._bodies.pop(entered, None)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._bodies)

    def _watch(self) -> None:
        while True:
            time.sleep(CHECK_INTERVAL_S)
            now_s = time.monotonic()
            with self._lock:
                kill_at = [body.kill_at_s(now_s) for body in self._bodies.values()]
            late = [instant for instant in kill_at if now_s >= instant]
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
