"""Revision 0006 (the console's) on a database populated under 0005: every row kept,
the runs cancelled before it marked (failed, ``last_error`` starting ``cancelled: ``,
and nothing else: a text that only looks alike in another case or on a running run
is left alone), the two indexes added; the downgrade gives 0005 back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.upgrades.migrate import downgrade
from tests.support import (
    COLUMNS_0006,
    COLUMNS_0009,
    COLUMNS_0010,
    SQL_BACKENDS,
    hand_made_row,
    insert_values,
    revision_of,
    row_values,
    table_rows,
)

RUNS = "_substrat_job_runs"
NEW_INDEXES = {"_substrat_job_runs_ended", "_substrat_job_runs_instance"}
# (status, last_error, marked by the migration)
CASES = [
    ("failed", "cancelled: wrong month", True),
    ("failed", "cancelled: ", True),
    ("failed", "Cancelled: a user's own text", False),
    ("failed", "ValueError: cancelled: not by an operator", False),
    ("failed", None, False),
    ("running", "cancelled: stale text", False),
    ("done", None, False),
]


@pytest.fixture
async def at_0005(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0005")
        rows = []
        for number, (status, error, _) in enumerate(CASES):
            row = hand_made_row(number, module_id="@test/jobs", job="old")
            values = row_values(row, without=(*COLUMNS_0006, *COLUMNS_0009, *COLUMNS_0010))
            values.update(status=status, last_error=error)
            values["ended_at"] = None if status == "running" else "2025-12-31T01:00:00.000Z"
            rows.append(values)
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


async def _indexes(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            sql = f"SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{RUNS}'"
        else:
            sql = f"SELECT indexname FROM pg_indexes WHERE tablename = '{RUNS}'"
        return {row[0] for row in await connection.exec_driver_sql(sql)}


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0006_keeps_every_row_and_marks_the_runs_cancelled_before_it(
    at_0005: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = at_0005
    columns = "id, status, last_error, ended_at, attempts"
    before = await table_rows(engine, RUNS, columns)
    await jobrun.upgrade(engine, "0006")
    assert await revision_of(engine) == "0006"
    # Read and driven as code of 0006 would (this code needs the workers' table of 0007).
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0006")
    assert await table_rows(engine, RUNS, columns) == before
    assert [marked for (marked,) in await table_rows(engine, RUNS, "cancelled")] == [
        int(expected) for *_, expected in CASES
    ]
    assert await _indexes(engine) >= NEW_INDEXES
    # Read through the store at the head (this code reads the run columns of 0009).
    await jobrun.upgrade(engine)
    records = [await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), row[0]) for row in before]
    assert [record.cancelled for record in records if record] == [c[2] for c in CASES]

    await downgrade(engine, "0005")
    assert await revision_of(engine) == "0005"
    assert await table_rows(engine, RUNS, columns) == before
    assert not NEW_INDEXES & await _indexes(engine)
