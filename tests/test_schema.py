"""The tables have one shape, whichever dialect emits or stores them.

Three views of the schema are reduced to the same plain-data "shape" and
compared: the contract's table (written out below), the SQLAlchemy metadata,
and what the inspector reflects from a database that ``jobrun.upgrade`` built
(SQLite and Postgres). The DDL compiled for each dialect is also compared as
text: the contract has one DDL for both engines.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Index, Table, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

import jobrun
from jobrun.sql.schema import VERSION_TABLE, job_runs, job_steps, metadata

RUNS = "_substrat_job_runs"
STEPS = "_substrat_job_steps"
LIVE = "status = 'running'"

# The contract's data model, as (column, type, nullable, server default).
EXPECTED: dict[str, Any] = {
    RUNS: {
        "columns": [
            ("id", "TEXT", False, None),
            ("module_id", "TEXT", False, None),
            ("job", "TEXT", False, None),
            ("instance", "TEXT", False, None),
            ("payload", "TEXT", False, None),
            ("status", "TEXT", False, None),
            ("cursor", "TEXT", True, None),
            ("counters", "TEXT", False, "'{}'"),
            ("attempts", "INTEGER", False, "0"),
            ("last_error", "TEXT", True, None),
            ("started_at", "TEXT", False, None),
            ("updated_at", "TEXT", False, None),
            ("next_attempt_at", "TEXT", True, None),
            ("ended_at", "TEXT", True, None),
        ],
        "primary_key": ["id"],
        # (name, columns, unique, partial predicate)
        "indexes": [
            ("_substrat_job_runs_due", ["status", "next_attempt_at", "id"], False, None),
            ("_substrat_job_runs_key", ["module_id", "job", "instance", "id"], False, None),
            ("_substrat_job_runs_live_key", ["module_id", "job", "instance"], True, LIVE),
        ],
    },
    STEPS: {
        "columns": [
            ("run_id", "TEXT", False, None),
            ("step", "TEXT", False, None),
            ("result", "TEXT", True, None),
            ("attempts", "INTEGER", False, "0"),
            ("last_error", "TEXT", True, None),
            ("recorded_at", "TEXT", False, None),
        ],
        "primary_key": ["run_id", "step"],
        "indexes": [],
    },
}

DIALECTS = [sqlite.dialect(), postgresql.dialect()]
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def _sql(value: Any) -> str | None:
    """One spelling for a default or a predicate, whoever wrote it.

    Postgres hands back what it stored: ``'{}'::text`` and ``(status = 'running'::text)``.
    """
    if value is None:
        return None
    found = " ".join(str(getattr(value, "text", value)).split())
    found = re.sub(r"::[a-z ]+", "", found)
    while found.startswith("(") and found.endswith(")"):
        found = found[1:-1].strip()
    return found


def _type_name(type_: Any, dialect: Dialect) -> str:
    return str(type_.compile(dialect=dialect)).upper()


def _metadata_shape(table: Table, dialect: Dialect) -> dict[str, Any]:
    def predicate(index: Index) -> str | None:
        return _sql(index.dialect_options[dialect.name]["where"])

    return {
        "columns": [
            (
                column.name,
                _type_name(column.type, dialect),
                column.nullable,
                _sql(column.server_default.arg) if column.server_default is not None else None,
            )
            for column in table.columns
        ],
        "primary_key": [column.name for column in table.primary_key.columns],
        "indexes": sorted(
            (index.name, [c.name for c in index.columns], bool(index.unique), predicate(index))
            for index in table.indexes
        ),
    }


def _reflected_shape(connection: Connection, table: str) -> dict[str, Any]:
    inspector = inspect(connection)
    dialect = connection.dialect

    def predicate(index: Any) -> str | None:
        options = index.get("dialect_options", {})
        return _sql(options.get(f"{dialect.name}_where"))

    return {
        "columns": [
            (
                column["name"],
                _type_name(column["type"], dialect),
                column["nullable"],
                _sql(column["default"]),
            )
            for column in inspector.get_columns(table)
        ],
        "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
        "indexes": sorted(
            (index["name"], index["column_names"], bool(index["unique"]), predicate(index))
            for index in inspector.get_indexes(table)
        ),
        # Nothing beyond the indexes above: no unique constraint on the key, no
        # foreign keys (a crashed run must stay restartable; the ledger is bare).
        "unique_constraints": inspector.get_unique_constraints(table),
        "foreign_keys": inspector.get_foreign_keys(table),
    }


def _reflected_tables(connection: Connection) -> dict[str, Any]:
    names = set(inspect(connection).get_table_names())
    assert names == {RUNS, STEPS, VERSION_TABLE}
    return {table: _reflected_shape(connection, table) for table in (RUNS, STEPS)}


def _expected_reflection() -> dict[str, Any]:
    return {
        name: {**shape, "unique_constraints": [], "foreign_keys": []}
        for name, shape in EXPECTED.items()
    }


@pytest.fixture
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on the requested backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'shape.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


@pytest.fixture
async def migrated(blank_url: str) -> AsyncIterator[AsyncEngine]:
    """A database built by ``jobrun.upgrade`` from nothing."""
    engine = create_async_engine(blank_url)
    try:
        await jobrun.upgrade(engine)
        yield engine
    finally:
        await engine.dispose()


async def _reflect(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as connection:
        return await connection.run_sync(_reflected_tables)


def test_metadata_is_the_contracts_data_model() -> None:
    assert set(metadata.tables) == {RUNS, STEPS}
    for dialect in DIALECTS:
        assert _metadata_shape(job_runs, dialect) == EXPECTED[RUNS], dialect.name
        assert _metadata_shape(job_steps, dialect) == EXPECTED[STEPS], dialect.name


def test_both_dialects_compile_the_same_ddl() -> None:
    def ddl(dialect: Dialect) -> list[str]:
        statements = []
        for table in metadata.sorted_tables:
            statements.append(str(CreateTable(table).compile(dialect=dialect)))
            statements.extend(
                str(CreateIndex(index).compile(dialect=dialect))
                for index in sorted(table.indexes, key=lambda index: str(index.name))
            )
        return [" ".join(statement.split()) for statement in statements]

    on_sqlite, on_postgres = (ddl(dialect) for dialect in DIALECTS)
    assert on_sqlite == on_postgres
    assert (
        "CREATE UNIQUE INDEX _substrat_job_runs_live_key ON _substrat_job_runs "
        "(module_id, job, instance) WHERE status = 'running'"
    ) in on_sqlite
    # The only unique thing on the key is that partial index.
    assert sum("UNIQUE" in statement for statement in on_sqlite) == 1


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_migrated_database_reflects_the_contracts_shape(migrated: AsyncEngine) -> None:
    assert await _reflect(migrated) == _expected_reflection()


@pytest.mark.postgres
async def test_sqlite_and_postgres_reflect_the_same_shape(
    tmp_path: Path, empty_postgres_url: str
) -> None:
    shapes = []
    for url in (f"sqlite+aiosqlite:///{tmp_path / 'both.db'}", empty_postgres_url):
        engine = create_async_engine(url)
        try:
            await jobrun.upgrade(engine)
            shapes.append(await _reflect(engine))
        finally:
            await engine.dispose()
    on_sqlite, on_postgres = shapes
    assert on_sqlite == on_postgres
    for reflected, dialect in zip(shapes, DIALECTS, strict=True):
        for table in (job_runs, job_steps):
            shape = _metadata_shape(table, dialect)
            assert {key: reflected[table.name][key] for key in shape} == shape


def _row(run_id: str, status: str) -> dict[str, str]:
    at = "2024-01-01T00:00:00.000Z"
    return {
        "id": run_id,
        "module_id": "@test/jobs",
        "job": "walk",
        "instance": "default",
        "payload": "null",
        "status": status,
        "started_at": at,
        "updated_at": at,
    }


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_live_key_index_admits_one_running_row_and_any_finished_rows(
    migrated: AsyncEngine,
) -> None:
    insert = text(
        f"INSERT INTO {RUNS} (id, module_id, job, instance, payload, status, started_at, "
        "updated_at) VALUES (:id, :module_id, :job, :instance, :payload, :status, "
        ":started_at, :updated_at)"
    )
    async with migrated.begin() as connection:
        for number, status in enumerate(["done", "failed", "done", "running"]):
            await connection.execute(insert, _row(f"{number:026d}", status))
        # Column defaults come from the database, as the contract says.
        defaults = (await connection.execute(text(f"SELECT counters, attempts FROM {RUNS}"))).all()
        assert set(defaults) == {("{}", 0)}
    with pytest.raises(IntegrityError):
        async with migrated.begin() as connection:
            await connection.execute(insert, _row("9" * 26, "running"))
    async with migrated.begin() as connection:
        # Another instance of the same job is another key.
        await connection.execute(insert, {**_row("8" * 26, "running"), "instance": "other"})
        live = await connection.execute(text(f"SELECT count(*) FROM {RUNS} WHERE {LIVE}"))
        assert live.scalar_one() == 2
