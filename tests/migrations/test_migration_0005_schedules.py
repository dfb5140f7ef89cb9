"""Revision 0005's schedules and retention part on a database populated under 0004:
each schedule's row is kept with no cron (so it starts again from its next slot),
each job's retention is recorded in a new table, and the downgrade gives 0004 back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from tests.support import SQL_BACKENDS, done_at_once, revision_of

SCHEDULES = "_substrat_job_schedules"
RETENTION = "_substrat_job_retention"
COLUMNS_0004 = "module_id, job, schedule, last_slot_at, last_run_id, updated_at"
ROWS_0004 = [
    ("reports", "tick", "", "2026-01-01T00:01:00.000Z", "01HQ0000000000000000000001", "x"),
    ("reports", "tick", "nightly", "2026-01-01T00:00:00.000Z", None, "y"),
]


@pytest.fixture
async def at_0004(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0004 with two schedules' rows."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0004")
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    f"INSERT INTO {SCHEDULES} ({COLUMNS_0004}) VALUES "
                    "(:m, :j, :s, :last_slot_at, :last_run_id, :updated_at)"
                ),
                [
                    dict(
                        zip(
                            ("m", "j", "s", "last_slot_at", "last_run_id", "updated_at"),
                            row,
                            strict=True,
                        )
                    )
                    for row in ROWS_0004
                ],
            )
        yield engine
    finally:
        await engine.dispose()


async def _rows(engine: AsyncEngine, columns: str) -> list[tuple[object, ...]]:
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT {columns} FROM {SCHEDULES} ORDER BY module_id, job, schedule")
        )
        return [tuple(row) for row in found]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0005_keeps_each_schedule_with_no_cron_and_goes_back(at_0004: AsyncEngine):
    engine = at_0004
    # To the head (the store needs it); 0006 does not touch the schedules.
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await _rows(engine, f"{COLUMNS_0004}, cron") == [(*row, None) for row in ROWS_0004]

    # Under this revision the cronless row starts from its next slot: nothing of the
    # month since its last slot is replayed, however its schedule catches up (the
    # store needs the head; 0006 leaves the schedules alone).
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()
    registry.register("reports", "tick", done_at_once, keep_for=timedelta(days=2))
    registry.schedule("reports", "tick", "* * * * *", catch_up="all")
    now = datetime(2026, 2, 1, 0, 0, 30, tzinfo=UTC)
    assert await jobrun.start_scheduled_runs(store, registry, now=now) == []
    # ("nightly" is no longer declared by the registry that registers its job: gone.)
    assert await _rows(engine, "schedule, cron, last_slot_at") == [
        ("", "* * * * *", "2026-02-01T00:00:30.000Z")
    ]
    started = await jobrun.start_scheduled_runs(store, registry, now=now + timedelta(minutes=1))
    assert [run.instance for run in started] == ["2026-02-01T00:01:00.000Z"]
    await store.record_retention({("reports", "tick"): 172800}, "2026-02-01T00:00:00.000Z")
    assert await store.recorded_retention() == {("reports", "tick"): 172800}

    # And back to 0004: the schedule's row without its cron, the retention table gone.
    await downgrade(engine, "0004")
    assert await revision_of(engine) == "0004"
    assert len(await _rows(engine, COLUMNS_0004)) == 1
    async with engine.connect() as connection:
        tables = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
    assert RETENTION not in tables
