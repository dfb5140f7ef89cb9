"""Revision 0003 (priority, the leased index, schedules) on a database populated under 0002."""

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
    SQL_BACKENDS,
    assert_walks_index_in_order,
    hand_made_row,
    insert_values,
    logged_store,
    query_plan,
    revision_of,
)

RUNS = "_substrat_job_runs"
CLAIM_ORDER = "_substrat_job_runs_claim_order"
COLUMNS_0002 = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_owner, lease_driver, "
    "lease_began_at, lease_takeovers"
)


@pytest.fixture
async def at_0002(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0002 with 3,000 runs: mostly finished, some running, one leased."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0002")
        rows = []
        for number in range(3000):
            row = hand_made_row(number, module_id="@test/jobs", job="walk")
            # Only the columns 0002 has (later revisions add more).
            values = {name: getattr(row, name) for name in COLUMNS_0002.split(", ")}
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
        found = await connection.execute(text(f"SELECT {COLUMNS_0002} FROM {RUNS} ORDER BY id"))
        return [tuple(row) for row in found]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0003_keeps_every_row_and_the_claim_reads_its_index(at_0002: AsyncEngine):
    engine = at_0002
    before = await _snapshot(engine)
    # To the head (the store needs it); 0004 only adds defaulted columns, 0005 an index.
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await _snapshot(engine) == before
    async with engine.connect() as connection:
        priorities = (await connection.execute(text(f"SELECT DISTINCT priority FROM {RUNS}"))).all()
        schedules = (await connection.execute(text("SELECT * FROM _substrat_job_schedules"))).all()
    assert (priorities, schedules) == ([(0,)], [])
    if engine.dialect.name == "postgresql":
        async with engine.begin() as connection:
            await connection.exec_driver_sql(f"ANALYZE {RUNS}")

    # The store's own claim statement, exactly as it sends it (through its hook).
    store, log = logged_store(engine)
    registry = jobrun.JobRegistry()
    registry.register("@test/jobs", "walk", lambda p: jobrun.PassResult(done=True))
    report = await jobrun.run_due_jobs(store, registry, limit=1, clock=FakeClock())
    claims = [(sql, tuple(values)) for operation, sql, values in log.seen if operation == "claim"]
    assert report.completed == 1
    async with engine.connect() as connection:
        plan = await query_plan(connection, *claims[0])
    if engine.dialect.name == "sqlite":
        # (The head's index: the job's range, revision 0011.)
        assert f"USING INDEX {CLAIM_ORDER} (<expr>=? AND <expr>=?" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        assert_walks_index_in_order(plan, CLAIM_ORDER)

    # And back to 0002: the rows as they were (but the one run the claim finished).
    await downgrade(engine, "0002")
    assert await revision_of(engine) == "0002"
    after = await _snapshot(engine)
    assert len(after) == len(before)
    assert sum(a != b for a, b in zip(after, before, strict=True)) == 1
