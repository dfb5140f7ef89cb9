"""A test clock: wall time, elapsed time, sleeps and deadlines that move only when told.

Everything the engine waits on (lease renewal, the pass budget, the worker's idle
waits) goes through its clock, so under a ``FakeClock`` those waits are virtual:
``advance()`` moves time and wakes every sleeper whose deadline it passes.

With ``autojump=True`` nobody has to advance it: whenever no task is ready to
run, time jumps straight to the earliest sleeper's deadline (what trio's
``MockClock(autojump_threshold=0)`` does). A 15-minute lease renewal or a
300-second pass budget then takes no real time, in a deterministic order. That
is sound when the code under test waits only on this clock and on other tasks
(the memory store); with a database's real I/O in flight the loop also looks
idle, so with a SQL store advance the clock by hand instead.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import TracebackType

from jobrun._core import BootInstant, Deadline, refuse


class FakeClock:
    """A clock that moves only when told to (or, with ``autojump``, when all are waiting).

    Call it (or ``now()``) to read the wall time; ``monotonic()`` counts virtual
    seconds from 0. Given a ``boot_id``, it also has a boot clock
    (:meth:`boot_instant`): its monotonic time under that name, so clocks made with
    one name are processes of one boot, which a :meth:`step_wall` does not move.
    """

    def __init__(
        self,
        start: datetime | None = None,
        *,
        autojump: bool = False,
        boot_id: str | None = None,
        boot_offset_s: float = 0.0,
    ) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise refuse(
                "start", "must be timezone-aware", message="FakeClock needs a timezone-aware start"
            )
        # Whole nanoseconds, so that many small advances add up exactly.
        self._elapsed_ns = 0
        self.autojump = autojump
        # Deadlines in a heap; a timer is live while it is in ``_wakes``.
        self._timers: list[tuple[int, int]] = []
        self._wakes: dict[int, Callable[[], None]] = {}
        self._order = itertools.count()
        self._jump_pending = False
        self.boot_id = boot_id
        # Where this clock's monotonic zero stands on the shared boot clock.
        self._boot_offset_ns = _nanoseconds(boot_offset_s)

    def __call__(self) -> datetime:
        return self._now

    def now(self) -> datetime:
        """The fake wall time (UTC), as calling the clock returns it."""
        return self._now

    def monotonic(self) -> float:
        """Seconds the clock has been advanced since it was made."""
        return self._elapsed_ns / 1e9

    def boot_instant(self) -> BootInstant | None:
        """The boot clock (``None`` without a ``boot_id``): milliseconds of monotonic
        time, from ``boot_offset_s``."""
        if self.boot_id is None:
            return None
        return BootInstant(self.boot_id, (self._boot_offset_ns + self._elapsed_ns) // 1_000_000)

    def advance(self, *, seconds: float = 0, milliseconds: float = 0) -> datetime:
        """Move time forward and wake every sleeper (and deadline) it passes, in order."""
        if seconds < 0 or milliseconds < 0:
            raise refuse(
                "seconds" if seconds < 0 else "milliseconds",
                "must not be negative",
                message="a FakeClock only moves forward",
            )
        self._move_to(self._elapsed_ns + _nanoseconds(seconds + milliseconds / 1000))
        return self._now

    def step_wall(self, *, seconds: float) -> datetime:
        """Step the wall time alone, either way (an NTP step, a VM resumed): the
        monotonic clock and every sleeper stay where they are."""
        self._now += timedelta(seconds=seconds)
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has moved ``seconds`` on (``<= 0``: just yield)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self._call_after(seconds, wake)
        try:
            await woken
        finally:
            self._cancel(timer)

    def timeout(self, seconds: float | None) -> Deadline:
        """Like ``asyncio.timeout(seconds)``, counted on this clock."""
        return _FakeDeadline(self, seconds)

    @property
    def sleepers(self) -> int:
        """How many sleeps and deadlines are waiting on the clock."""
        return len(self._wakes)

    def _call_after(self, seconds: float, wake: Callable[[], None]) -> int:
        timer = next(self._order)
        heapq.heappush(self._timers, (self._elapsed_ns + _nanoseconds(seconds), timer))
        self._wakes[timer] = wake
        if self.autojump:
            self._schedule_jump()
        return timer

    def _move_to(self, elapsed_ns: int) -> None:
        self._now += timedelta(microseconds=(elapsed_ns - self._elapsed_ns) / 1000)
        self._elapsed_ns = elapsed_ns
        while self._timers and self._timers[0][0] <= elapsed_ns:
            _at, timer = heapq.heappop(self._timers)
            wake = self._wakes.pop(timer, None)
            if wake is not None:
                wake()

    def _cancel(self, timer: int) -> None:
        self._wakes.pop(timer, None)

    def _next_deadline(self) -> int | None:
        while self._timers and self._timers[0][1] not in self._wakes:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _schedule_jump(self) -> None:
        if not self._jump_pending:
            self._jump_pending = True
            asyncio.get_running_loop().call_soon(self._jump_when_idle)

    def _jump_when_idle(self) -> None:
        loop = asyncio.get_running_loop()
        if _has_ready_callbacks(loop):
            # Something can still run: look again after it has.
            loop.call_soon(self._jump_when_idle)
            return
        self._jump_pending = False
        deadline_ns = self._next_deadline()
        if deadline_ns is None or not self.autojump:
            return
        self._move_to(max(deadline_ns, self._elapsed_ns))
        if self._next_deadline() is not None:
            self._schedule_jump()


def _nanoseconds(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def _has_ready_callbacks(loop: asyncio.AbstractEventLoop) -> bool:
    # asyncio has no public "is the loop idle" question; the standard loop keeps
    # its runnable callbacks in ``_ready``.
    ready = getattr(loop, "_ready", None)
    if ready is None:
        raise RuntimeError("FakeClock(autojump=True) needs the standard asyncio event loop")
    return len(ready) > 0


class _FakeDeadline:
    """``asyncio.timeout`` whose expiry is set off by a ``FakeClock`` instead of the loop."""

    def __init__(self, clock: FakeClock, seconds: float | None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._inner = asyncio.timeout(None)
        self._timer: int | None = None
        self._target_ns = 0

    async def __aenter__(self) -> _FakeDeadline:
        await self._inner.__aenter__()
        if self._seconds is not None:
            self._target_ns = self._clock._elapsed_ns + _nanoseconds(self._seconds)
            self._timer = self._clock._call_after(self._seconds, self._expire)
        return self

    def _expire(self) -> None:
        # A deadline at or before the loop's now fires on the next loop iteration.
        self._inner.reschedule(asyncio.get_running_loop().time())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        if self._timer is not None:
            self._clock._cancel(self._timer)
        await self._inner.__aexit__(exc_type, exc, traceback)
        return None

    def expired(self) -> bool:
        return self._inner.expired()

    def remaining_s(self) -> float | None:
        """Seconds left on the clock before the deadline (``None``: no deadline)."""
        if self._seconds is None:
            return None
        return self._target_ns / 1e9 - self._clock.monotonic()

    def extend(self, seconds: float) -> None:
        """Move the deadline ``seconds`` later (a rate-limit wait is not the body's time)."""
        if self._seconds is None or self._timer is None:
            return
        self._clock._cancel(self._timer)
        self._target_ns += _nanoseconds(seconds)
        wait_s = self._target_ns / 1e9 - self._clock.monotonic()
        self._timer = self._clock._call_after(wait_s, self._expire)
