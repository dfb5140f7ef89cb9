"""Revision 0009 (pause and unpause) on a database populated under 0008, both ways, on
both engines: every run kept as it was, the two run columns added empty and the two
tables created; the new code pauses a run, a job and a limit on it; the compatibility
record stays at 0006 (code of 0006 to 0008 may run on, honouring no pause); the
downgrade makes every run waiting for an unpause due again and gives 0008 back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.predicates import PARKED_AT
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
    table_rows,
)

RUNS = "_substrat_job_runs"
NEW_TABLES = {"_substrat_job_pauses", "_substrat_job_limit_pauses"}
OLD_COLUMNS = "id, status, next_attempt_at, lease_owner, attempts"


@pytest.fixture
async def at_0008(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0008")
        rows = [row_values(hand_made_row(number, job="old"), without=(*COLUMNS_0009, *COLUMNS_0010))
                for number in range(4)]  # fmt: skip
        rows[1] |= {"status": "done", "ended_at": rows[1]["started_at"]}
        rows[2] |= {"next_attempt_at": "2026-06-01T00:00:00.000Z"}
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0009_adds_the_pauses_and_its_downgrade_makes_waiting_runs_due(
    at_0008: AsyncEngine,
) -> None:
    engine = at_0008
    before = await table_rows(engine, RUNS, OLD_COLUMNS)
    assert NEW_TABLES.isdisjoint(await table_names(engine))
    await jobrun.upgrade(engine)  # to the head: the pauses below are the new code's
    assert await revision_of(engine) == SCHEMA_REVISION
    assert await table_rows(engine, RUNS, OLD_COLUMNS) == before
    assert await table_rows(engine, RUNS, "paused_at, pause_reason") == [(None, None)] * 4
    assert await table_names(engine) >= NEW_TABLES
    async with engine.connect() as connection:
        record = await connection.execute(text(f"SELECT oldest_code_revision FROM {COMPAT_TABLE}"))
        assert list(record.scalars()) == ["0006"]
    # The new code pauses on it at once: a run, a job, a limit.
    store = jobrun.SqlJobRunStore(engine)
    ids = [row[0] for row in before]
    paused = await jobrun.pause_job_run(store, ids[0], reason="hold")
    assert (paused.outcome, paused.pause_reason) == ("paused", "hold")
    assert (
        await jobrun.pause_job(store, module_id="elsewhere", job="old") == 2
    )  # the other live runs
    assert await jobrun.pause_limit(store, "api")
    health = await jobrun.job_run_health(store)
    assert (health.paused, list(health.paused_jobs), list(health.paused_limits)) == (
        3,
        [("elsewhere", "old")],
        ["api"],
    )
    assert [row[2] for row in await table_rows(engine, RUNS, OLD_COLUMNS)] == [
        PARKED_AT,
        None,
        PARKED_AT,
        PARKED_AT,
    ]
    await downgrade(engine, "0008")
    assert await revision_of(engine) == "0008"
    assert NEW_TABLES.isdisjoint(await table_names(engine))
    # Code of 0008 knows no pause: the runs that waited for one are due again at once
    # (the one that backed off until June too: its pause had forgotten that).
    after = await table_rows(engine, RUNS, OLD_COLUMNS)
    assert [row[2] for row in after] == [None, None, None, None]
    assert [row[:2] for row in after] == [row[:2] for row in before]
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_code_of_0008_may_run_against_0009(
    at_0008: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jobrun.upgrade(at_0008)
    # The record says 0006: the store's check lets code of 0008 run (honouring no pause).
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0008")
    runs = await jobrun.job_runs(jobrun.SqlJobRunStore(at_0008))
    assert len(runs) == 4
