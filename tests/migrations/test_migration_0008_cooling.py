"""Revision 0008 (a rate limit that cools down) on a database with buckets taken
under 0006: every bucket kept as it was, the two columns added empty on both
engines, a cooling down written and read back; the downgrade gives 0006 back
with the buckets intact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, revision_of

BUCKETS = "_substrat_rate_buckets"
BEFORE = [
    ("api", "50.0", 5, 2000, "2026-12-01T10:00:00.000Z"),
    ("other", "0.5", 1, -1000, "2026-12-01T10:00:01.500Z"),
]


@pytest.fixture
async def at_0006(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0006")
        async with engine.begin() as connection:
            for row in BEFORE:
                await connection.execute(
                    text(
                        f"INSERT INTO {BUCKETS} (limit_key, per_second, burst, milli_tokens, "
                        "refilled_at) VALUES (:key, :rate, :burst, :tokens, :at)"
                    ),
                    dict(zip(("key", "rate", "burst", "tokens", "at"), row, strict=True)),
                )
        yield engine
    finally:
        await engine.dispose()


async def _buckets(engine: AsyncEngine, columns: str) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT {columns} FROM {BUCKETS} ORDER BY limit_key")
        )
        return [tuple(row) for row in found]


async def _columns(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = await connection.exec_driver_sql(f"PRAGMA table_info({BUCKETS})")
            return {row[1] for row in rows}
        rows = await connection.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns "
            f"WHERE table_name = '{BUCKETS}' AND table_schema = current_schema()"
        )
        return {row[0] for row in rows}


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0008_adds_the_cooling_columns_and_keeps_every_bucket(at_0006: AsyncEngine) -> None:
    engine = at_0006
    old = "limit_key, per_second, burst, milli_tokens, refilled_at"
    assert "cooling_until" not in await _columns(engine)
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await _buckets(engine, old) == BEFORE
    assert await _buckets(engine, "cooling_until, cooling_reason") == [(None, None)] * 2
    # The new code cools a limit on it, and health reads it back.
    store = jobrun.SqlJobRunStore(engine)
    await store.cool_limit("api", 50.0, 5, 60.0, "429 from api")
    usage = await store.limit_usage(format_instant(FakeClock().now()))
    cooling = {bucket.key: bucket.cooling_reason for bucket in usage.buckets}
    assert cooling == {"api": "429 from api", "other": None}
    await downgrade(engine, "0006")
    assert await revision_of(engine) == "0006"
    assert {"cooling_until", "cooling_reason"}.isdisjoint(await _columns(engine))
    assert [row[0] for row in await _buckets(engine, old)] == ["api", "other"]
