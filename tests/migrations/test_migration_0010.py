"""Revision 0010 (lease expiries on the boot clock) on a database populated under
0009, both ways, on both engines: every run kept as it was, the two run columns
added empty; the new code's SQLite claims write them (Postgres leaves them NULL);
the compatibility record stays at 0006 (code of 0006 to 0009 ignores the columns);
the downgrade drops them and gives 0009 back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import ClaimRequest
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import (
    COLUMNS_0010,
    SQL_BACKENDS,
    column_names,
    hand_made_row,
    insert_values,
    revision_of,
    row_values,
    table_rows,
)

RUNS = "_substrat_job_runs"
OLD_COLUMNS = "id, status, next_attempt_at, lease_owner, attempts, paused_at"


@pytest.fixture
async def at_0009(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0009")
        rows = [row_values(hand_made_row(number, job="old"), without=COLUMNS_0010)
                for number in range(3)]  # fmt: skip
        rows[1] |= {"status": "done", "ended_at": rows[1]["started_at"]}
        rows[2] |= {"lease_owner": "OLD", "next_attempt_at": "2026-06-01T00:00:00.000Z"}
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0010_adds_the_boot_clock_columns_and_its_downgrade_drops_them(
    at_0009: AsyncEngine,
) -> None:
    engine = at_0009
    before = await table_rows(engine, RUNS, OLD_COLUMNS)
    assert set(COLUMNS_0010).isdisjoint(await column_names(engine, RUNS))
    # To the head: the new code needs it (0011 only remakes two indexes).
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await table_rows(engine, RUNS, OLD_COLUMNS) == before
    assert await table_rows(engine, RUNS, ", ".join(COLUMNS_0010)) == [(None, None)] * 3
    async with engine.connect() as connection:
        record = await connection.execute(text(f"SELECT oldest_code_revision FROM {COMPAT_TABLE}"))
        assert list(record.scalars()) == ["0006"]
    # The new code claims on it at once: on SQLite the lease is written on the boot
    # clock too; Postgres judges on its own clock and leaves the columns empty.
    store = jobrun.SqlJobRunStore(engine)
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC), boot_id="boot")
    run = await jobrun.start_job_run(store, module_id="new", job="j", payload={}, clock=clock)
    at = format_instant(clock.now())
    boot = clock.boot_instant()
    assert boot is not None
    request = ClaimRequest(
        at,
        "T",
        "me",
        {("new", "j"): add_milliseconds(at, 60_000)},
        boot=boot,
        boot_expires_ms={("new", "j"): boot.ms + 60_000},
    )
    claimed = await store.claim(request)
    assert claimed is not None
    assert claimed.row.id == run.id
    sqlite = engine.dialect.name == "sqlite"
    assert (claimed.row.lease_boot_id, claimed.row.lease_boot_expires_ms) == (
        ("boot@T", 60_000) if sqlite else (None, None)
    )
    await downgrade(engine, "0009")
    assert await revision_of(engine) == "0009"
    assert set(COLUMNS_0010).isdisjoint(await column_names(engine, RUNS))
    assert (await table_rows(engine, RUNS, OLD_COLUMNS))[:3] == before  # hand-made ids sort first
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_code_of_0009_may_run_against_0010(
    at_0009: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jobrun.upgrade(at_0009)
    # The record says 0006: the store's check lets code of 0009 run (it ignores the columns).
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0009")
    runs = await jobrun.job_runs(jobrun.SqlJobRunStore(at_0009))
    assert len(runs) == 3
