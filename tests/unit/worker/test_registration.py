"""The worker's row in each database (``jobrun.worker.registration``): over many databases
the heartbeat stretches and the first writes spread out, so an idle worker's writes stay
bounded whatever the number of databases it serves."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from jobrun import JobRegistry
from jobrun._core import WorkerRow, parse_instant
from jobrun._core.operator.worker_registry import MAX_BEATS_PER_S
from jobrun.testing import FakeClock
from jobrun.worker.registration import Registration


class _Beats:
    """A database's store that keeps the rows written."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.rows: list[tuple[float, WorkerRow]] = []

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        self.rows.append((self.clock.monotonic(), row))

    async def forget_worker(self, worker_id: str) -> None:
        return None


class _Database:
    def __init__(self, clock: FakeClock) -> None:
        self.store = _Beats(clock)
        self.stop = asyncio.Event()
        self.label = "scope"
        self.path = None  # not a SQLite file: written through the store


@contextlib.asynccontextmanager
async def _opened(database: Any) -> AsyncIterator[None]:
    yield


async def _beats_over(served: int, seconds: float) -> list[tuple[float, WorkerRow]]:
    # autojump: the fake time moves to the next deadline whenever every task waits.
    clock = FakeClock(autojump=True)
    registration = Registration(
        JobRegistry(), "worker", clock, 10.0, served=lambda: served, chance=random.Random(7)
    )
    database = _Database(clock)
    # A stand-in database: the store, the stop and the label are all ``keep`` uses.
    task = asyncio.create_task(registration.keep(database, _opened))  # type: ignore[arg-type]
    # Virtual time: the fake clock jumps from one of the registration's waits to the next.
    await clock.sleep(seconds)
    database.stop.set()
    await task
    return database.store.rows


async def test_a_worker_over_few_databases_beats_at_once_and_every_heartbeat() -> None:
    rows = await _beats_over(served=3, seconds=35)
    assert [at for at, _ in rows] == [0.0, 10.0, 20.0, 30.0]
    row = rows[0][1]
    gone_in = parse_instant(row.expires_at) - parse_instant(row.heartbeat_at)
    assert gone_in == timedelta(seconds=30)


async def test_a_worker_over_many_databases_spreads_its_first_beats_and_stretches_the_rest() -> (
    None
):
    served = 1000
    stretched = served / MAX_BEATS_PER_S
    rows = await _beats_over(served=served, seconds=2.5 * stretched)
    first_at = rows[0][0]
    # The first write waits a random part of the stretched heartbeat, not zero.
    assert 0 < first_at <= stretched
    assert [at - first_at for at, _ in rows[1:]] == [stretched, 2 * stretched][: len(rows) - 1]
    row = rows[0][1]
    gone_in = parse_instant(row.expires_at) - parse_instant(row.heartbeat_at)
    # Readers keep the row as long as three of its own (stretched) heartbeats.
    assert gone_in == timedelta(seconds=3 * stretched)
