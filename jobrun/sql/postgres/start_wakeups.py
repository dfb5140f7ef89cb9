"""Postgres: wake-ups for single starts that never serialise their commits.

A transaction that sent a NOTIFY takes one database-wide lock while it commits
(Postgres queues notifications in commit order), so starts that each carry
their own NOTIFY commit one at a time: measured with 8 concurrent callers, 337
inserts/s with a NOTIFY each against 1,655 without (``docs/design.md``,
"Starts: batches, transactions, later"). So a store lets one NOTIFY be in
flight at a time: a start that finds none carries it in its own statement (one
round trip, as before); a start that finds one in flight inserts without it,
and its wake-up goes out in the next NOTIFY, which carries every job waiting by
then (one statement for any number of starts). A start returns only once its
wake-up was sent, after its own commit, so a listening worker never looks
before the run is there.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable

log = logging.getLogger("jobrun.store")

Send = Callable[[list[str]], Awaitable[object]]
"""Sends one NOTIFY statement for these payloads (a JSON array of them)."""


class _Turn:
    """One event loop's wake-ups: whether a NOTIFY is in flight, and those waiting."""

    def __init__(self) -> None:
        self.in_flight = False
        self.pending: set[str] = set()
        self.sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class StartWakeUps:
    """The wake-ups of one store's single starts (per event loop: futures are loop-bound)."""

    def __init__(self) -> None:
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turn] = (
            weakref.WeakKeyDictionary()
        )
        self._carrying_on: set[asyncio.Future[None]] = set()

    def _turn(self) -> _Turn:
        loop = asyncio.get_running_loop()
        turn = self._turns.get(loop)
        if turn is None:
            turn = self._turns[loop] = _Turn()
        return turn

    def take(self) -> bool:
        """Whether the caller's statement should carry its NOTIFY (none in flight); if so,
        the caller must call :meth:`release` once its statement returned."""
        turn = self._turn()
        if turn.in_flight:
            return False
        turn.in_flight = True
        return True

    async def release(self, send: Send) -> None:
        """The caller's NOTIFY is done: send the wake-ups that waited meanwhile."""
        self._turn().in_flight = False
        await self._send_pending(send)

    async def after_commit(self, payload: str, send: Send) -> None:
        """Wake for ``payload``, whose run was committed without a NOTIFY: in the next
        one sent (by this caller, or by the one in flight once it is done)."""
        turn = self._turn()
        turn.pending.add(payload)
        sent = turn.sent
        await self._send_pending(send)
        await asyncio.shield(sent)

    async def _send_pending(self, send: Send) -> None:
        turn = self._turn()
        while turn.pending and not turn.in_flight:
            turn.in_flight = True
            payloads, sent = sorted(turn.pending), turn.sent
            turn.pending = set()
            turn.sent = asyncio.get_running_loop().create_future()
            try:
                await send(payloads)
            except BaseException as error:
                # Workers still find the runs at their next look (the due timer,
                # the sweep); the starts themselves were committed.
                log.warning("could not send the wake-up for new runs: %s", error)
                if not isinstance(error, Exception):
                    turn.in_flight = False
                    self._carry_on(send)
                    raise
            finally:
                turn.in_flight = False
                if not sent.done():
                    sent.set_result(None)

    def _carry_on(self, send: Send) -> None:
        """This sender was cancelled: those who waited for the next NOTIFY still get it."""
        task = asyncio.ensure_future(self._send_pending(send))
        self._carrying_on.add(task)
        task.add_done_callback(self._carrying_on.discard)
