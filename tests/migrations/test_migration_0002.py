"""Revision 0002 (leases) on a database that already holds runs written under 0001.

Each test builds an empty database (SQLite file, empty Postgres database), takes
it to revision 0001 only, writes rows by hand as 0001-era code would have left
them, and then moves it through 0002 and back.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.sql.schema import DUE_AT, SCHEMA_REVISION, job_runs
from jobrun.sql.upgrades.migrate import downgrade
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, query_plan, revision_of

RUNS = "_substrat_job_runs"
STEPS = "_substrat_job_steps"
DUE_AT_INDEX = "_substrat_job_runs_due_at"
MODULE, JOB = "@test/jobs", "walk"

# Revision 0001's columns, in order; 0002 appends the four lease columns.
COLUMNS_0001 = [
    "id",
    "module_id",
    "job",
    "instance",
    "payload",
    "status",
    "cursor",
    "counters",
    "attempts",
    "last_error",
    "started_at",
    "updated_at",
    "next_attempt_at",
    "ended_at",
]
LEASE_COLUMNS = ["lease_owner", "lease_driver", "lease_began_at", "lease_takeovers"]
STEP_COLUMNS = ["run_id", "step", "result", "attempts", "last_error", "recorded_at"]

# Ids sort by age, but the backing-off run's id and start are older than the fresh
# run's while it becomes due later: due order and id order disagree.
BACKING_OFF = "01HQ0000000000000000000001"
FRESH = "01HQ0000000000000000000002"
DONE = "01HQ0000000000000000000003"
FAILED = "01HQ0000000000000000000004"


def _run(run_id: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS_0001)
    row.update(id=run_id, module_id=MODULE, job=JOB, counters="{}", attempts=0)
    row.update(values)
    return row


ROWS_0001 = [
    # Running, failed two passes so far, waiting for its backoff to pass.
    _run(
        BACKING_OFF,
        instance="b",
        payload='{"source": "crm"}',
        status="running",
        cursor='{"page": 3}',
        counters='{"pages": 3}',
        attempts=2,
        last_error="TimeoutError: upstream timed out",
        started_at="2024-01-01T00:00:00.000Z",
        updated_at="2024-01-01T00:05:00.000Z",
        next_attempt_at="2024-01-01T00:20:00.000Z",
    ),
    # Running, started and never driven.
    _run(
        FRESH,
        instance="a",
        payload="null",
        status="running",
        started_at="2024-01-01T00:10:00.000Z",
        updated_at="2024-01-01T00:10:00.000Z",
    ),
    # Done, with a committed null cursor (the TEXT 'null', not SQL NULL).
    _run(
        DONE,
        instance="a",
        payload='"x"',
        status="done",
        cursor="null",
        counters='{"pages": 7}',
        started_at="2023-12-01T00:00:00.000Z",
        updated_at="2023-12-02T00:00:00.000Z",
        ended_at="2023-12-02T00:00:00.000Z",
    ),
    # Failed for good, its error and its last pass's ledger kept.
    _run(
        FAILED,
        instance="b",
        payload="{}",
        status="failed",
        cursor='{"page": 1}',
        counters='{"pages": 1}',
        attempts=5,
        last_error="ValueError: bad row 17",
        started_at="2023-12-03T00:00:00.000Z",
        updated_at="2023-12-04T00:00:00.000Z",
        ended_at="2023-12-04T00:00:00.000Z",
    ),
]
LEDGER_0001 = [
    # The backing-off run's interrupted pass: one step done, one that threw.
    (BACKING_OFF, "fetch", '{"rows": 10}', 1, None, "2024-01-01T00:04:00.000Z"),
    (BACKING_OFF, "store", None, 2, "TimeoutError: upstream timed out", "2024-01-01T00:05:00.000Z"),
    (FAILED, "fetch", "null", 1, None, "2023-12-04T00:00:00.000Z"),
    (FAILED, "store", None, 5, "ValueError: bad row 17", "2023-12-04T00:00:00.000Z"),
]
# After every stored timestamp.
LATER = datetime(2024, 2, 1, tzinfo=UTC)


@pytest.fixture
async def at_0001(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """A database at revision 0001 holding ROWS_0001 and LEDGER_0001."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine, "0001")
        assert await revision_of(engine) == "0001"
        await _insert(engine, RUNS, ROWS_0001)
        await _insert(
            engine, STEPS, [dict(zip(STEP_COLUMNS, row, strict=True)) for row in LEDGER_0001]
        )
        yield engine
    finally:
        await engine.dispose()


async def _insert(engine: AsyncEngine, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    statement = text(
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(f':{column}' for column in columns)})"
    )
    async with engine.begin() as connection:
        await connection.execute(statement, rows)


async def _rows(engine: AsyncEngine, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    order = "id" if table == RUNS else "run_id, step"
    async with engine.connect() as connection:
        found = await connection.execute(
            text(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}")
        )
        return [tuple(row) for row in found]


async def _snapshot_0001(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
    """Every run and ledger row, in 0001's columns."""
    return await _rows(engine, RUNS, COLUMNS_0001), await _rows(engine, STEPS, STEP_COLUMNS)


def _written_0001() -> tuple[list[Any], list[Any]]:
    runs = sorted(tuple(row[column] for column in COLUMNS_0001) for row in ROWS_0001)
    return runs, sorted(LEDGER_0001)


def _catalog(connection: Connection) -> tuple[list[str], dict[str, str]]:
    """The runs table's columns, and its indexes' key lists as the catalog keeps them."""
    columns = [column["name"] for column in inspect(connection).get_columns(RUNS)]
    if connection.dialect.name == "sqlite":
        query = f"SELECT name, sql FROM sqlite_master WHERE tbl_name = '{RUNS}' AND sql IS NOT NULL"
    else:
        query = f"SELECT indexname, indexdef FROM pg_indexes WHERE tablename = '{RUNS}'"
    indexes = {}
    for name, ddl in connection.exec_driver_sql(query):
        if " INDEX " in ddl and not name.endswith("_pkey"):
            keys = re.search(r" ON \S+ (?:USING btree )?\((.*?)\)(?: WHERE|$)", ddl)
            assert keys is not None, ddl
            indexes[name] = keys[1].lower()
    return columns, indexes


async def _schema(engine: AsyncEngine) -> tuple[list[str], dict[str, str]]:
    async with engine.connect() as connection:
        return await connection.run_sync(_catalog)


INDEXES_0001 = {
    "_substrat_job_runs_due": "status, next_attempt_at, id",
    "_substrat_job_runs_key": "module_id, job, instance, id",
    "_substrat_job_runs_live_key": "module_id, job, instance",
}
INDEXES_0002 = {
    DUE_AT_INDEX: "status, coalesce(next_attempt_at, started_at), id",
    "_substrat_job_runs_key": "module_id, job, instance, id",
    "_substrat_job_runs_live_key": "module_id, job, instance",
}


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_the_upgrade_keeps_every_row_and_leases_nothing(at_0001: AsyncEngine) -> None:
    engine = at_0001
    written = _written_0001()
    assert await _snapshot_0001(engine) == written
    assert await _schema(engine) == (COLUMNS_0001, INDEXES_0001)

    # To 0002 only: 0003's changes have a test of their own (test_migration_0003.py).
    await jobrun.upgrade(engine, "0002")
    assert await revision_of(engine) == "0002"
    assert await _schema(engine) == (COLUMNS_0001 + LEASE_COLUMNS, INDEXES_0002)
    # Every run and ledger row as it was, byte for byte.
    assert await _snapshot_0001(engine) == written
    # No run is leased by the upgrade, and none has been taken over.
    assert await _rows(engine, RUNS, LEASE_COLUMNS) == [(None, None, None, 0)] * len(ROWS_0001)

    # And back: 0001's shape again, the rows still exactly as written.
    await downgrade(engine, "0001")
    assert await revision_of(engine) == "0001"
    assert await _schema(engine) == (COLUMNS_0001, INDEXES_0001)
    assert await _snapshot_0001(engine) == written
    # The round trip can be made again.
    await jobrun.upgrade(engine, "0002")
    assert await _snapshot_0001(engine) == written
    assert await _schema(engine) == (COLUMNS_0001 + LEASE_COLUMNS, INDEXES_0002)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_store_drives_the_runs_written_under_0001(at_0001: AsyncEngine) -> None:
    engine = at_0001
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    clock = FakeClock(LATER)
    registry = jobrun.JobRegistry()
    passes: list[tuple[str, Any, Any]] = []
    bodies: list[tuple[str, str]] = []

    @registry.job(MODULE, JOB)
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append((p.run.id, p.payload, p.cursor))

        def fetch() -> dict[str, int]:
            bodies.append((p.run.id, "fetch"))
            return {"rows": 1}

        fetched = await p.step("fetch", fetch)
        await p.step("store", lambda: bodies.append((p.run.id, "store")))
        p.count("rows", fetched["rows"])
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed, report.errors) == (2, 2, [])
    # Claimed in the order they became due, not in id order.
    assert passes == [
        (FRESH, None, None),
        (BACKING_OFF, {"source": "crm"}, {"page": 3}),
    ]
    # The step the 0001-era pass completed is served from its ledger row; the
    # one that threw runs again.
    assert bodies == [(FRESH, "fetch"), (FRESH, "store"), (BACKING_OFF, "store")]

    records = {record.id: record for record in await jobrun.job_runs(store)}
    assert set(records) == {BACKING_OFF, FRESH, DONE, FAILED}
    for run_id in (FRESH, BACKING_OFF):
        record = records[run_id]
        assert (record.status, record.ended_at, record.updated_at) == ("done", LATER, LATER)
        assert (record.attempts, record.last_error, record.next_attempt_at) == (0, None, None)
        assert (record.lease_driver, record.lease_expires_at, record.lease_takeovers) == (
            None,
            None,
            0,
        )
        assert record.decode_error is None
        assert await store.steps(run_id) == {}, "a commit empties the ledger"
    assert records[FRESH].counters == {"rows": 1}
    # Counters carry over from the pass committed before the upgrade.
    assert records[BACKING_OFF].counters == {"pages": 3, "rows": 10}
    assert records[BACKING_OFF].payload == {"source": "crm"}
    assert (records[BACKING_OFF].started_at, records[BACKING_OFF].instance) == (
        datetime(2024, 1, 1, tzinfo=UTC),
        "b",
    )

    done, failed = records[DONE], records[FAILED]
    assert (done.status, done.payload, done.cursor, done.counters) == (
        "done",
        "x",
        None,
        {"pages": 7},
    )
    assert (done.attempts, done.last_error) == (0, None)
    assert done.ended_at == datetime(2023, 12, 2, tzinfo=UTC)
    assert (failed.status, failed.cursor, failed.counters) == ("failed", {"page": 1}, {"pages": 1})
    assert (failed.attempts, failed.last_error) == (5, "ValueError: bad row 17")
    assert failed.ended_at == datetime(2023, 12, 4, tzinfo=UTC)
    for record in (done, failed):
        assert (record.decode_error, record.lease_driver, record.lease_takeovers) == (None, None, 0)
    assert await _rows(engine, STEPS, STEP_COLUMNS) == sorted(
        row for row in LEDGER_0001 if row[0] == FAILED
    )

    # Nothing left to do; the finished runs are not claimed.
    again = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert again.attempted == 0

    # Down to 0001 with the driven rows: all kept, the lease columns gone.
    kept = await _snapshot_0001(engine)
    await downgrade(engine, "0001")
    assert await _schema(engine) == (COLUMNS_0001, INDEXES_0001)
    assert await _snapshot_0001(engine) == kept


def _named_upgrade_command(message: str) -> list[str]:
    """The ``jobrun db upgrade ...`` command the error tells the operator to run."""
    commands = [part for part in re.findall(r"`([^`]*)`", message) if "db upgrade" in part]
    assert len(commands) == 1, message
    return commands[0].split()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_store_refuses_a_0001_database_and_names_the_command(
    blank_url: str, at_0001: AsyncEngine
) -> None:
    store = jobrun.SqlJobRunStore(at_0001)
    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, lambda p: jobrun.PassResult(done=True))
    with pytest.raises(jobrun.SchemaOutdatedError) as caught:
        await jobrun.run_due_jobs(store, registry, clock=FakeClock(LATER))
    assert (caught.value.found, caught.value.expected) == ("0001", SCHEMA_REVISION)
    assert caught.value.code == "schema_outdated"
    message = str(caught.value)
    assert "'0001'" in message
    assert f"'{SCHEMA_REVISION}'" in message
    assert "jobrun.upgrade(engine)" in message
    with pytest.raises(jobrun.SchemaOutdatedError):
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance="c")
    with pytest.raises(jobrun.SchemaOutdatedError):
        await jobrun.job_runs(store)
    # Nothing was written by the refused calls.
    assert await _snapshot_0001(at_0001) == _written_0001()

    # The command the message names works as written, installed or in a checkout.
    program, *arguments = _named_upgrade_command(message)
    assert (program, arguments) == ("jobrun", ["db", "upgrade", "--url", "<url>"])
    upgraded = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "jobrun", *arguments[:-1], blank_url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert await revision_of(at_0001) == SCHEMA_REVISION
    # The same store now works.
    report = await jobrun.run_due_jobs(store, registry, clock=FakeClock(LATER))
    assert (report.attempted, report.completed) == (2, 2)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_the_claim_reads_runs_through_the_due_at_index(at_0001: AsyncEngine) -> None:
    """Many finished runs, few live ones: the claim seeks the index and needs no sort."""
    engine = at_0001
    many = [
        _run(
            f"01HR{number:022d}",
            instance=f"i{number}",
            payload="null",
            status="running" if number % 100 == 0 else ("done", "failed")[number % 2],
            started_at=f"2024-01-0{1 + number % 9}T00:00:00.000Z",
            updated_at="2024-01-10T00:00:00.000Z",
            next_attempt_at=None if number % 3 else "2024-01-11T00:00:00.000Z",
        )
        for number in range(1, 5001)
    ]
    await _insert(engine, RUNS, many)
    # The index is built by the migration over rows already there. (0003 orders claims
    # by priority first; test_migration_0003.py checks the store's claim against it.)
    await jobrun.upgrade(engine, "0002")
    dialect = engine.dialect.name
    if dialect == "postgresql":
        async with engine.begin() as connection:
            await connection.exec_driver_sql(f"ANALYZE {RUNS}")

    now = "2024-02-01T00:00:00.000Z"
    due_first = (
        select(job_runs.c.id)
        .where(job_runs.c.status == "running", now >= DUE_AT)
        .order_by(DUE_AT, job_runs.c.id)
        .limit(1)
    )
    compiled = str(due_first.compile(engine.sync_engine, compile_kwargs={"literal_binds": True}))

    async with engine.connect() as connection:
        plan = await query_plan(connection, compiled)
    if dialect == "sqlite":
        assert f"USING INDEX {DUE_AT_INDEX} (status=? AND <expr><?)" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
    else:
        assert re.search(rf"Index (Only )?Scan using {DUE_AT_INDEX}\b", plan), plan
        assert "COALESCE(next_attempt_at, started_at) <=" in plan, plan
        assert not re.search(r"\bSort\b", plan), plan
