"""A served database's loops: a round, a sleep on the worker's clock, again, until its stop.

Each of the worker's parts (drivers, upkeep, the LISTEN, the turns) repeats its
work per database this way, so a stop ends every sleep at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from jobrun._core import Clock
from jobrun.worker.database import ServedDatabase

log = logging.getLogger("jobrun.worker")


async def sleep(clock: Clock, seconds: float, stop: asyncio.Event) -> None:
    """Sleep ``seconds`` on ``clock``, or until ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        async with clock.timeout(seconds):
            await stop.wait()


async def repeat(
    clock: Clock,
    database: ServedDatabase,
    round_: Callable[[], Awaitable[float | None]],
    failed: Callable[[Exception], float],
) -> None:
    """Run ``round_`` until the database's stop, sleeping after each round (on the
    worker's clock; a stop ends the sleep) the seconds it returned (``None``: no
    sleep). A round that raises is logged by ``failed``, which says how long to
    sleep before the next."""
    while not database.stop.is_set():
        try:
            wait_s = await round_()
        except Exception as error:
            wait_s = failed(error)
        if wait_s is not None:
            await sleep(clock, wait_s, database.stop)


def warning(
    database: ServedDatabase, message: str, wait_s: float, *more: object
) -> Callable[[Exception], float]:
    """A loop's failure: logged as a warning (``message`` of the database, the error and
    ``more``), then ``wait_s`` before the next round."""

    def failed(error: Exception) -> float:
        log.warning(message, database.label, error, *more, extra={"database": database.label})
        return wait_s

    return failed
