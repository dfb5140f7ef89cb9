"""Revision 0005's limits block (rate-limit buckets, concurrency slots) on a database
populated under 0004: added beside the runs, which it leaves as they were, and
dropped again on the way down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import RunRow
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, hand_made_row, insert_values, revision_of, row_values

RUNS = "_substrat_job_runs"
LIMIT_TABLES = {"_substrat_rate_buckets", "_substrat_concurrency_slots"}

LATER = (
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
COLUMNS_0004 = ", ".join(name for name in RunRow.__dataclass_fields__ if name not in LATER)


@pytest.fixture
async def at_0004(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0004 with a few runs."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0004")
        rows = [hand_made_row(number) for number in range(20)]
        # The columns 0004 has (the deferral columns come with 0005).
        await insert_values(engine, RUNS, [row_values(row, without=LATER) for row in rows])
        yield engine
    finally:
        await engine.dispose()


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        names = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
    return set(names)


async def _runs(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {COLUMNS_0004} FROM {RUNS} ORDER BY id"))
        return [tuple(row) for row in found]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0005_adds_the_limit_tables_and_takes_them_away_again(at_0004: AsyncEngine):
    engine = at_0004
    before = await _runs(engine)
    assert not (await _tables(engine)) & LIMIT_TABLES
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION  # 0006 on top changes none of this
    assert await _tables(engine) >= LIMIT_TABLES
    assert await _runs(engine) == before

    # The new tables work: a token, a slot, and both seen by health.
    store = jobrun.SqlJobRunStore(engine)
    assert await store.take_token("api", 10.0, 2) == 0.0
    now_at = format_instant(FakeClock().now())
    assert await store.acquire_slot("tenant-1", 1, before[0][0], "s", "TOKEN", now_at)
    usage = await store.limit_usage(now_at)
    assert [bucket.key for bucket in usage.buckets] == ["api"]

    await downgrade(engine, "0004")
    assert await revision_of(engine) == "0004"
    assert not (await _tables(engine)) & LIMIT_TABLES
    assert await _runs(engine) == before
