"""Revision 0004 (each run's lease epoch and committed passes) on a database populated
under 0003."""

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
from tests.support import SQL_BACKENDS, hand_made_row, insert_values, revision_of, row_values

RUNS = "_substrat_job_runs"
NEW_COLUMNS = ("lease_epoch", "passes_committed")
# Columns of later revisions, which a 0003 table does not have.
LATER_COLUMNS = (
    "deferrals",
    "deferred_reason",
    "job_version",
    "cancelled",
    "error_origin",
    "paused_at",
    "pause_reason",
    "lease_boot_id",
    "lease_boot_expires_ms",
)
COLUMNS_0003 = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_owner, lease_driver, "
    "lease_began_at, lease_takeovers, priority"
)


@pytest.fixture
async def at_0003(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0003 with 300 runs: mostly finished, some running, one leased."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0003")
        rows = []
        for number in range(300):
            row = hand_made_row(number, module_id="@test/jobs", job="fence")
            values = row_values(row, without=(*NEW_COLUMNS, *LATER_COLUMNS))
            values["status"] = "running" if number % 50 == 0 else "done"
            values["ended_at"] = None if number % 50 == 0 else "2025-12-31T01:00:00.000Z"
            if number == 50:
                values.update(lease_owner="tok", lease_driver="old", lease_takeovers=1)
            rows.append(values)
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


async def _snapshot(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {COLUMNS_0003} FROM {RUNS} ORDER BY id"))
        return [tuple(row) for row in found]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0004_keeps_every_row_and_its_runs_start_at_epoch_zero(at_0003: AsyncEngine):
    engine = at_0003
    before = await _snapshot(engine)
    # To the head (the store needs it); 0005 and 0006 only add columns, tables and an index.
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await _snapshot(engine) == before
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT DISTINCT {', '.join(NEW_COLUMNS)} FROM {RUNS}")
        )
        assert found.all() == [(0, 0)]

    # A run from before the upgrade is driven as any other: its first claim is epoch 1.
    store = jobrun.SqlJobRunStore(engine)
    epochs: list[int] = []
    registry = jobrun.JobRegistry()

    @registry.job("@test/jobs", "fence")
    async def fence(p: jobrun.JobPass) -> jobrun.PassResult:
        epochs.append(p.lease_epoch)
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(store, registry, limit=1, clock=FakeClock())
    assert (report.completed, epochs) == (1, [1])
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT status, lease_epoch, passes_committed FROM {RUNS} WHERE lease_epoch > 0")
        )
        assert found.all() == [("done", 1, 1)]

    # And back to 0003: the rows as they were (but the one run the pass finished).
    await downgrade(engine, "0003")
    assert await revision_of(engine) == "0003"
    after = await _snapshot(engine)
    assert len(after) == len(before)
    assert sum(a != b for a, b in zip(after, before, strict=True)) == 1
