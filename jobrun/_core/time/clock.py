"""The one clock the engine reads: wall instants, elapsed time, sleeping and deadlines.

The core never reads the time or sleeps on its own: the lease keeper's renewal
waits, the pass time budget and the worker's idle waits all go through a
:class:`Clock`, so a test clock (``jobrun.testing.FakeClock``) can drive them.
The real one is ``jobrun._host.system.SYSTEM_CLOCK``.

Older code passed a bare callable returning an aware ``datetime`` as the clock;
:func:`as_clock` still takes one (it only fakes the wall instant; sleeping and
deadlines stay real).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Protocol, TypeAlias, runtime_checkable

from jobrun._core.model.refusals import refuse_type, type_name


class Deadline(Protocol):
    """An async context manager that cancels its body when time runs out (and then
    raises ``TimeoutError``), like ``asyncio.timeout``."""

    async def __aenter__(self) -> Deadline: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None: ...

    def expired(self) -> bool: ...


@runtime_checkable
class Clock(Protocol):
    """Time as the engine sees it."""

    def now(self) -> datetime:
        """The wall instant, timezone-aware: what stored timestamps are made of."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go back: for durations."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...

    def timeout(self, seconds: float | None) -> Deadline:
        """Bound an ``async with`` body by ``seconds`` on this clock (``None``: no bound)."""
        ...


WallClock: TypeAlias = Callable[[], datetime]
ClockLike: TypeAlias = Clock | WallClock


class WaitsFromBase:
    """A clock whose wall time alone is its own (a subclass's ``now``): elapsed
    time, sleeping and deadlines are ``base``'s."""

    def __init__(self, base: Clock) -> None:
        self._base = base

    def monotonic(self) -> float:
        return self._base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self._base.sleep(seconds)

    def timeout(self, seconds: float | None) -> Deadline:
        return self._base.timeout(seconds)


class _WallOnly(WaitsFromBase):
    """A bare wall-time callable, with the rest of the clock taken from ``base``."""

    def __init__(self, wall: WallClock, base: Clock) -> None:
        super().__init__(base)
        self._wall = wall

    def now(self) -> datetime:
        return self._wall()


def as_clock(clock: ClockLike, base: Clock) -> Clock:
    """``clock`` as a :class:`Clock`; a bare callable borrows all but ``now`` from ``base``."""
    if isinstance(clock, Clock):
        return clock
    if callable(clock):
        return _WallOnly(clock, base)
    raise refuse_type(
        "clock",
        f"must be a Clock or a callable returning a datetime, got {type_name(clock)}",
        message=f"clock must be a Clock or a callable returning a datetime, got {clock!r}",
    )
