"""Revision 0005 (each run's deferrals in a row and the last one's reason) on a database
populated under 0004."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import (
    COLUMNS_0006,
    COLUMNS_0009,
    COLUMNS_0010,
    SQL_BACKENDS,
    hand_made_row,
    insert_values,
    revision_of,
    row_values,
)

RUNS = "_substrat_job_runs"
NEW_COLUMNS = ("deferrals", "deferred_reason")
COLUMNS_0004 = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_owner, lease_driver, "
    "lease_began_at, lease_takeovers, priority, lease_epoch, passes_committed"
)


@pytest.fixture
async def at_0004(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0004 with 200 runs: mostly finished, some running, one leased."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0004")
        rows = []
        for number in range(200):
            row = hand_made_row(number, module_id="@test/jobs", job="later")
            values = row_values(
                row, without=(*NEW_COLUMNS, *COLUMNS_0006, *COLUMNS_0009, *COLUMNS_0010)
            )
            values["status"] = "running" if number % 40 == 0 else "done"
            values["ended_at"] = None if number % 40 == 0 else "2025-12-31T01:00:00.000Z"
            values["passes_committed"] = number % 7
            if number == 40:
                values.update(lease_owner="tok", lease_driver="old", lease_epoch=3)
            rows.append(values)
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


async def _snapshot(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {COLUMNS_0004} FROM {RUNS} ORDER BY id"))
        return [tuple(row) for row in found]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0005_keeps_every_row_and_its_runs_read_no_deferrals(at_0004: AsyncEngine):
    engine = at_0004
    before = await _snapshot(engine)
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION  # 0006 on top changes none of this
    assert await _snapshot(engine) == before
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT DISTINCT {', '.join(NEW_COLUMNS)} FROM {RUNS}")
        )
        assert found.all() == [(0, None)]

    # A run from before the upgrade can be deferred like any other.
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()

    @registry.job("@test/jobs", "later")
    async def later(p: jobrun.JobPass) -> jobrun.PassResult:
        raise jobrun.RetryAfter(60, reason="quota")

    report = await jobrun.run_due_jobs(store, registry, limit=1, clock=FakeClock())
    assert (report.attempted, report.deferred) == (1, 1)
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT id, {', '.join(NEW_COLUMNS)} FROM {RUNS} WHERE deferrals > 0")
        )
        assert found.all() == [(f"{0:026d}", 1, "quota")]

    # And back to 0004: every row as it was (the deferral changed only the run's
    # due time and updated_at).
    await downgrade(engine, "0004")
    assert await revision_of(engine) == "0004"
    after = await _snapshot(engine)
    assert len(after) == len(before)
    assert sum(a != b for a, b in zip(after, before, strict=True)) == 1
