"""Revision 0011 (the claim's indexes, one range per job, live runs only) on both
engines: rows kept, the two indexes made again on the claim's job key, the
compatibility record left at 0006, and the downgrade giving 0010's indexes back;
and the reason for it: a claim on a table that has never been analyzed reads the
front of its jobs' ranges instead of sorting every live run of the job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION
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
    row_values,
    table_rows,
)

RUNS = "_substrat_job_runs"
CLAIM_ORDER = "_substrat_job_runs_claim_order"
DUE_ORDER = "_substrat_job_runs_due_order"
# Enough for Postgres, without statistics, to prefer the key indexes (and a sort)
# for the claim of one job on 0010.
RUNS_PER_JOB = 8_000


async def _index_sql(engine: AsyncEngine) -> dict[str, str]:
    """The two claim indexes as the catalog stores them, whitespace squeezed."""
    if engine.dialect.name == "sqlite":
        query = "SELECT name, sql FROM sqlite_master WHERE name IN (:claim, :due)"
    else:
        query = "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN (:claim, :due)"
    async with engine.connect() as connection:
        rows = await connection.execute(text(query), {"claim": CLAIM_ORDER, "due": DUE_ORDER})
        return {name: " ".join(sql.split()) for name, sql in rows}


@pytest.fixture
async def at_0010(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0010")
        rows = [row_values(hand_made_row(number, job="old")) for number in range(3)]
        rows[1] |= {"status": "done", "ended_at": rows[1]["started_at"]}
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0011_keys_the_claim_indexes_on_the_job_and_its_downgrade_restores_them(
    at_0010: AsyncEngine,
) -> None:
    engine = at_0010
    before_rows = await table_rows(engine, RUNS, "*")
    before = await _index_sql(engine)
    # 0010's: status first, every run in them.
    assert all(sql.lower().count("(status,") == 1 for sql in before.values()), before
    await jobrun.upgrade(engine)
    assert await revision_of(engine) == SCHEMA_REVISION == "0011"
    assert await table_rows(engine, RUNS, "*") == before_rows
    after = await _index_sql(engine)
    for name, sql in after.items():
        assert "substr(module_id, 1), substr(job, 1)" in sql, (name, sql)
        assert "status = 'running'" in sql, (name, sql)
    async with engine.connect() as connection:
        record = await connection.execute(text(f"SELECT oldest_code_revision FROM {COMPAT_TABLE}"))
        assert list(record.scalars()) == ["0006"]
    # The new code drives the old rows at once.
    registry = jobrun.JobRegistry()
    registry.register("elsewhere", "old", lambda p: jobrun.PassResult(done=True))
    store = jobrun.SqlJobRunStore(engine)
    report = await jobrun.run_due_jobs(store, registry, clock=FakeClock())
    assert report.completed == 2

    await downgrade(engine, "0010")
    assert await revision_of(engine) == "0010"
    assert await _index_sql(engine) == before


async def _claims_on_a_fresh_table(engine: AsyncEngine, jobs: list[str]) -> list[tuple[str, Any]]:
    """The claim statements a drive sends over RUNS_PER_JOB queued runs of each of ``jobs``
    on a table that has never been analyzed (one in eight claims goes by age)."""
    clock = FakeClock()
    store, log = logged_store(engine)
    starts = [
        jobrun.JobStart(module_id="@test/jobs", job=job, instance=f"i{number}", payload={})
        for job in jobs
        for number in range(RUNS_PER_JOB)
    ]
    await jobrun.start_job_runs(store, starts, clock=clock)
    registry = jobrun.JobRegistry()
    for job in jobs:
        registry.register("@test/jobs", job, lambda p: jobrun.PassResult(done=True))
    report = await jobrun.run_due_jobs(store, registry, limit=9, clock=clock)
    assert report.completed == 9
    return [(sql, tuple(values)) for operation, sql, values in log.seen if operation == "claim"]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
@pytest.mark.parametrize("jobs", [["a"], ["a", "b"]], ids=["one-job", "two-jobs"])
async def test_a_claim_on_a_table_never_analyzed_reads_the_front_of_its_jobs_ranges(
    blank_url: str, jobs: list[str]
) -> None:
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine)
        claims = await _claims_on_a_fresh_table(engine, jobs)
        async with engine.connect() as connection:
            if engine.dialect.name == "postgresql":
                analyzed = await connection.execute(
                    text("SELECT count(*) FROM pg_stats WHERE tablename = :runs"), {"runs": RUNS}
                )
                assert analyzed.scalar() == 0, "the table must not have statistics yet"
            by_age = [claim for claim in claims if "priority IS NOT NULL" in claim[0]]
            by_priority = [claim for claim in claims if claim not in by_age]
            assert by_age
            assert by_priority
            for (statement, values), index in (
                (by_age[0], DUE_ORDER),
                (by_priority[0], CLAIM_ORDER),
            ):
                plan = await query_plan(connection, statement, values)
                _assert_reads_ranges(engine, plan, index, len(jobs))
    finally:
        await engine.dispose()


def _assert_reads_ranges(engine: AsyncEngine, plan: str, index: str, jobs: int) -> None:
    """Each job's due runs come from ``index``, in its order: no other index of the
    runs, no scan of the table, no sort of a job's runs."""
    others = ("_substrat_job_runs_job_status", "_substrat_job_runs_live_key",
              "_substrat_job_runs_key", "_substrat_job_runs_status")  # fmt: skip
    assert not any(other in plan for other in others), plan
    if engine.dialect.name == "sqlite":
        assert plan.count(f"USING INDEX {index} (<expr>=? AND <expr>=?") == jobs, plan
        # One job: no sort at all; two: only the two firsts are ordered.
        assert plan.count("TEMP B-TREE") == (0 if jobs == 1 else 1), plan
        return
    # One scan of the index: the job's range, or, for several jobs, in a lateral
    # subquery run once per job asked for.
    assert plan.count(f"Index Scan using {index} on") == 1, plan
    assert ("Function Scan on asked" in plan) == (jobs > 1), plan
    assert_walks_index_in_order(plan, index)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_code_of_0010_may_run_against_0011(
    at_0010: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jobrun.upgrade(at_0010)
    # The record says 0006: the store's check lets code of 0010 run (its claims read
    # the same runs; only their plan depends on statistics, as it did).
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0010")
    runs = await jobrun.job_runs(jobrun.SqlJobRunStore(at_0010))
    assert len(runs) == 3
