"""Revision 0005, fair claims: the due-order index exists after the upgrade and is gone
after the downgrade; on a populated table each claim reads its own index in order
(the by-age claim the new one, the priority claim still the claim-order one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.records import ClaimRequest
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from tests.support import (
    SQL_BACKENDS,
    assert_walks_index_in_order,
    hand_made_row,
    insert_values,
    logged_store,
    query_plan,
    revision_of,
    row_values,
)

RUNS = "_substrat_job_runs"
DUE_ORDER = "_substrat_job_runs_due_order"
CLAIM_ORDER = "_substrat_job_runs_claim_order"
JOB = ("@test/jobs", "fair")
NOW = "2026-01-01T00:00:00.000Z"

# The columns both 0004 and 0005 have.
KEPT = "id, status, priority, next_attempt_at, started_at, ended_at, lease_epoch"


@pytest.fixture
async def populated(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """The head with 3,000 runs of one job: mostly finished, some running, mixed priorities."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine)
        rows = []
        for number in range(3000):
            row = hand_made_row(number, module_id=JOB[0], job=JOB[1])
            values = row_values(row)
            values["status"] = "running" if number % 10 == 0 else "done"
            values["ended_at"] = None if number % 10 == 0 else "2025-12-31T01:00:00.000Z"
            values["priority"] = number % 7
            rows.append(values)
        await insert_values(engine, RUNS, rows)
        if engine.dialect.name == "postgresql":
            async with engine.begin() as connection:
                await connection.exec_driver_sql(f"ANALYZE {RUNS}")
        yield engine
    finally:
        await engine.dispose()


async def _index_names(engine: AsyncEngine) -> set[str]:
    def names(connection: Any) -> set[str]:
        if connection.dialect.name == "sqlite":
            found = connection.exec_driver_sql(
                f"SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{RUNS}'"
            )
        else:
            found = connection.exec_driver_sql(
                f"SELECT indexname FROM pg_indexes WHERE tablename = '{RUNS}'"
            )
        return {row[0] for row in found}

    async with engine.connect() as connection:
        return await connection.run_sync(names)


async def _claim_plan(engine: AsyncEngine, by_age: bool) -> str:
    """The plan of the store's own claim statement, exactly as it sends it."""
    store, log = logged_store(engine)
    request = ClaimRequest(NOW, "T", "me", {JOB: NOW}, by_age=by_age)
    assert await store.claim(request) is not None
    claims = [(sql, tuple(values)) for operation, sql, values in log.seen if operation == "claim"]
    async with engine.connect() as connection:
        return await query_plan(connection, *claims[0])


def _reads_in_order(plan: str, index: str, dialect: str) -> None:
    if dialect == "sqlite":
        # (The head's indexes: the job's range, revision 0011.)
        assert f"USING INDEX {index} (<expr>=? AND <expr>=?" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        assert_walks_index_in_order(plan, index)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_each_claim_reads_its_own_index_in_order(populated: AsyncEngine) -> None:
    dialect = populated.dialect.name
    _reads_in_order(await _claim_plan(populated, by_age=True), DUE_ORDER, dialect)
    _reads_in_order(await _claim_plan(populated, by_age=False), CLAIM_ORDER, dialect)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0005_adds_the_due_order_index_and_its_downgrade_drops_it(
    populated: AsyncEngine,
) -> None:
    assert await revision_of(populated) == SCHEMA_REVISION
    assert DUE_ORDER in await _index_names(populated)
    async with populated.connect() as connection:
        before = (await connection.execute(text(f"SELECT {KEPT} FROM {RUNS} ORDER BY id"))).all()
    await downgrade(populated, "0004")
    assert await revision_of(populated) == "0004"
    names = await _index_names(populated)
    assert DUE_ORDER not in names
    assert CLAIM_ORDER in names
    async with populated.connect() as connection:
        after = (await connection.execute(text(f"SELECT {KEPT} FROM {RUNS} ORDER BY id"))).all()
    assert after == before
    await jobrun.upgrade(populated)
    assert DUE_ORDER in await _index_names(populated)
