"""Single starts from concurrent callers, sent to the database together.

Each ``start_job_run`` of a store (without ``connection=``) joins the store's
queue. When no batch is in flight the queue is sent at once, so a lone start
waits for nobody; while one is in flight, the starts that arrive wait for it
and go out together in the next batch: one statement (``start_many``'s), one
commit and, on Postgres, one NOTIFY per job for all of them. A commit that
notified holds a database-wide lock, so starts that each notified committed one
at a time; and SQLite has one writer anyway. Measured figures are in
``docs/design.md`` ("Starts: batches, transactions, later").

The rules of a batch hold: a key started twice in one batch makes one run, the
first caller's, and the other caller joins it (as it would, a moment later). A
batch that fails fails each of its callers with the same error; a caller that
is cancelled leaves its start in the batch (as a cancelled statement may still
have committed).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence

from jobrun._core import RunRow

Send = Callable[[Sequence[RunRow]], Awaitable[list[tuple[RunRow, bool]]]]
"""Starts these rows (no two of one key) as one batch: ``start_many``'s answer."""

MOST_PER_BATCH = 1000
"""A flood of callers is sent in batches of at most this many starts."""

_Waiting = tuple[RunRow, "asyncio.Future[tuple[RunRow, bool]]"]


class _Queue:
    """One event loop's starts waiting, and whether a batch is in flight."""

    def __init__(self) -> None:
        self.waiting: list[_Waiting] = []
        self.sending: asyncio.Task[None] | None = None


class StartBatches:
    """A store's queue of single starts (per event loop: futures are loop-bound)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue] = (
            weakref.WeakKeyDictionary()
        )

    async def start(self, row: RunRow) -> tuple[RunRow, bool]:
        """Start ``row`` in the next batch: ``(row as inserted, True)`` or ``(the live
        run of its key, False)``."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue()
        answer: asyncio.Future[tuple[RunRow, bool]] = loop.create_future()
        queue.waiting.append((row, answer))
        if queue.sending is None:
            # A task of its own: a caller cancelled must not cancel its batchmates' batch.
            queue.sending = loop.create_task(self._send_waiting(queue))
        return await answer

    async def _send_waiting(self, queue: _Queue) -> None:
        try:
            while queue.waiting:
                batch = queue.waiting[:MOST_PER_BATCH]
                del queue.waiting[:MOST_PER_BATCH]
                await self._send_batch(batch)
        finally:
            queue.sending = None
            for _row, answer in queue.waiting:
                # Only when this task itself was cancelled (its loop closing).
                if not answer.done():
                    answer.cancel()

    async def _send_batch(self, batch: list[_Waiting]) -> None:
        first: dict[tuple[str, str, str], RunRow] = {}
        for row, _answer in batch:
            first.setdefault((row.module_id, row.job, row.instance), row)
        try:
            answers = await self._send(list(first.values()))
        except Exception as error:
            for _row, answer in batch:
                if not answer.done():
                    answer.set_exception(error)
            return
        except BaseException:
            for _row, answer in batch:
                answer.cancel()
            raise
        started = dict(zip(first, answers, strict=True))
        for row, answer in batch:
            key = (row.module_id, row.job, row.instance)
            stored, inserted = started[key]
            # A second start of a key in one batch joins the first one's run.
            result = (stored, inserted and first[key] is row)
            if not answer.done():
                answer.set_result(result)
