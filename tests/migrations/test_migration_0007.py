"""Revision 0007 (the workers' table) on a database populated under 0006: every run kept,
the compatibility record left at 0006 (code of 0006 may run on: it only does not
register), the table usable at once by a store, and the downgrade gives 0006 back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.worker_rows import WorkerRow, jobs_text
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from tests.support import (
    COLUMNS_0009,
    COLUMNS_0010,
    SQL_BACKENDS,
    hand_made_row,
    insert_values,
    revision_of,
    row_values,
    table_names,
)

RUNS = "_substrat_job_runs"
WORKERS = "_substrat_job_workers"


@pytest.fixture
async def at_0006(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0006")
        rows = [
            row_values(hand_made_row(number, job="old"), without=(*COLUMNS_0009, *COLUMNS_0010))
            for number in range(3)
        ]
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


async def _scalars(engine: AsyncEngine, sql: str) -> list[Any]:
    async with engine.connect() as connection:
        return list((await connection.execute(text(sql))).scalars())


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0007_adds_the_workers_table_and_leaves_runs_and_record_alone(
    at_0006: AsyncEngine,
) -> None:
    engine = at_0006
    before = await _scalars(engine, f"SELECT id FROM {RUNS} ORDER BY id")
    await jobrun.upgrade(engine)  # through 0007 to head
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await _scalars(engine, f"SELECT id FROM {RUNS} ORDER BY id") == before
    assert await _scalars(engine, f"SELECT oldest_code_revision FROM {COMPAT_TABLE}") == ["0006"]
    store = jobrun.SqlJobRunStore(engine)
    row = WorkerRow("w", "name", "host", 1, jobs_text([("m", "j")]), "a", "b", "9")
    await store.beat_worker(row)
    assert await store.live_workers("5") == [row]

    await downgrade(engine, "0006")
    assert await revision_of(engine) == "0006"
    assert WORKERS not in await table_names(engine)
    assert await _scalars(engine, f"SELECT id FROM {RUNS} ORDER BY id") == before
