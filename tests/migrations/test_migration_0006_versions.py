"""Revision 0006 (each run's job version, and the compatibility record) on a database
populated under 0005; and what code of another revision does against it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.records import RunRow
from jobrun.sql.schema import COMPAT_TABLE
from jobrun.sql.upgrades.compat import refusal
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import (
    COLUMNS_0006,
    COLUMNS_0009,
    COLUMNS_0010,
    SQL_BACKENDS,
    hand_made_row,
    insert_values,
    revision_of,
    row_values,
)

RUNS = "_substrat_job_runs"
COLUMNS_0005 = ", ".join(
    name
    for name in RunRow.__dataclass_fields__
    if name not in (*COLUMNS_0006, *COLUMNS_0009, *COLUMNS_0010)
)


@pytest.fixture
async def at_0005(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """Revision 0005 with 50 runs: mostly finished, some running."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0005")
        rows = []
        for number in range(50):
            row = hand_made_row(number, module_id="@test/jobs", job="versioned")
            values = row_values(row, without=(*COLUMNS_0006, *COLUMNS_0009, *COLUMNS_0010))
            values["status"] = "running" if number % 10 == 0 else "done"
            values["cursor"] = '{"n": 7}' if number == 0 else None
            rows.append(values)
        await insert_values(engine, RUNS, rows)
        yield engine
    finally:
        await engine.dispose()


async def _runs(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {COLUMNS_0005} FROM {RUNS} ORDER BY id"))
        return [tuple(row) for row in found]


async def _scalars(engine: AsyncEngine, query: str) -> list[Any]:
    async with engine.connect() as connection:
        return list((await connection.execute(text(query))).scalars())


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return set(await connection.run_sync(lambda sync: inspect(sync).get_table_names()))


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_0006_keeps_every_run_at_version_1_and_records_the_oldest_code(
    at_0005: AsyncEngine,
) -> None:
    engine = at_0005
    before = await _runs(engine)
    await jobrun.upgrade(engine, "0006")
    assert await revision_of(engine) == "0006"
    assert await _runs(engine) == before
    assert await _scalars(engine, f"SELECT DISTINCT job_version FROM {RUNS}") == [None]
    assert await _scalars(engine, f"SELECT oldest_code_revision FROM {COMPAT_TABLE}") == ["0006"]

    # A run from before is of version 1: version-2 code upgrades its cursor. (Driven
    # at the head: this code needs the workers' table of 0007 and the columns of 0009.)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()
    seen: list[Any] = []

    @registry.job("@test/jobs", "versioned", version=2, upgrade={1: lambda c: {"at": c["n"]}})
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.cursor)
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(store, registry, limit=1, clock=FakeClock())
    assert report.completed == 1
    assert seen == [{"at": 7}]
    assert await _scalars(engine, f"SELECT job_version FROM {RUNS} WHERE id = '{0:026d}'") == [2]

    # And back to 0005: the column and the record gone, every other column as it was
    # (the pass changed only the run it completed).
    await downgrade(engine, "0005")
    assert await revision_of(engine) == "0005"
    assert COMPAT_TABLE not in await _tables(engine)
    after = await _runs(engine)
    assert sum(a != b for a, b in zip(after, before, strict=True)) == 1
    async with engine.connect() as connection:
        columns = await connection.run_sync(
            lambda sync: [column["name"] for column in inspect(sync).get_columns(RUNS)]
        )
    assert "job_version" not in columns


async def _store_of(engine: AsyncEngine) -> jobrun.SqlJobRunStore:
    """A new store (each checks the schema once, at its first operation)."""
    return jobrun.SqlJobRunStore(engine)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_code_older_than_the_record_refuses_a_newer_database(
    blank: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jobrun.upgrade(blank, "0006")
    # This code, as if it were of revision 0005 (before versioned jobs), on a 0006 database.
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0005")
    with pytest.raises(jobrun.CodeOutdatedError) as refused:
        await jobrun.job_runs(await _store_of(blank))
    assert str(refused.value) == (
        "this database is at revision 0006 and needs jobrun code of revision 0006 or "
        "later; this jobrun knows revision 0005: upgrade jobrun, or stop these workers"
    )
    assert (refused.value.code, refused.value.found, refused.value.needed) == (
        "code_outdated",
        "0006",
        "0006",
    )
    # Nothing was claimed or written: the refusal comes before the first statement.
    registry = jobrun.JobRegistry()
    registry.register("m", "j", lambda p: jobrun.PassResult(done=True))
    with pytest.raises(jobrun.CodeOutdatedError):
        await jobrun.run_due_jobs(await _store_of(blank), registry)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_future_revision_decides_by_its_record(
    blank: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jobrun.upgrade(blank, "0007")
    # Revision 0007 (the workers' table) lets code of 0006 run: its record says 0006.
    # (A read of the ledger, which 0006 and this code spell alike, stands for its work.)
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0006")
    assert await (await _store_of(blank)).steps("no such run") == {}
    # One that it may not: its record says 0007.
    async with blank.begin() as connection:
        await connection.execute(text(f"UPDATE {COMPAT_TABLE} SET oldest_code_revision = '0007'"))
    with pytest.raises(jobrun.CodeOutdatedError, match="needs jobrun code of revision 0007"):
        await (await _store_of(blank)).steps("no such run")
    # Code of that revision runs; code of a later one too.
    for code in ("0007", "0008"):
        monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", code)
        if code == "0008":
            with pytest.raises(jobrun.SchemaOutdatedError):
                await (await _store_of(blank)).steps("no such run")
        else:
            assert await (await _store_of(blank)).steps("no such run") == {}


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_database_from_before_the_record_lets_older_code_run(
    blank: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0005 declared no record: code of 0004 ran against it (as the pinned-commit
    # test shows with real 0004 code); this code, pretending to be 0004, passes the
    # check too (a read of the ledger, which 0004 and 0006 spell alike).
    await jobrun.upgrade(blank, "0005")
    monkeypatch.setattr("jobrun.sql.store.base.SCHEMA_REVISION", "0004")
    assert await (await _store_of(blank)).steps("no such run") == {}


def test_the_refusal_rule() -> None:
    assert refusal("0006", "0006", "0006") is None
    assert refusal("0007", "0006", "0006") is None
    assert refusal("0007", None, "0004") is None
    assert isinstance(refusal("0007", "0007", "0006"), jobrun.CodeOutdatedError)
    assert isinstance(refusal("0005", "0006", "0006"), jobrun.SchemaOutdatedError)
    assert isinstance(refusal(None, None, "0006"), jobrun.SchemaOutdatedError)
