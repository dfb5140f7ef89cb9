"""One served database of the many-databases worker: its drivers' idle waits and the stop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from jobrun._host.system import resolve_clock
from jobrun.sql.store import SqlJobRunStore
from jobrun.worker.database import ServedDatabase


async def test_a_driver_that_goes_idle_after_the_stop_does_not_wait(tmp_path: Path) -> None:
    # The race behind a worker that once did not return after its stop: driver A is idle
    # when the stop comes, so the stopper's one wake_all goes to A and leaves nothing
    # pending; driver B, back from a read it was awaiting, then goes idle with no timeout.
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'scope.db'}", poolclass=NullPool)
    database = ServedDatabase(SqlJobRunStore(engine), resolve_clock(None))
    first = asyncio.create_task(database.idle(None))
    await asyncio.sleep(0)  # sleep: lets A reach its wait
    database.stop.set()
    database.wake_all()
    assert await first is True
    assert database.pending is False
    second = asyncio.create_task(database.idle(None))
    # A ceiling for a hang, not a speed goal.
    assert await asyncio.wait_for(second, 5) is True
    await engine.dispose()
