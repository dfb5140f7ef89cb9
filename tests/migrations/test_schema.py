"""The tables have one shape, whichever dialect emits or stores them.

Three views of the schema are reduced to the same plain-data "shape" and
compared: the contract's table (written out below), the SQLAlchemy metadata,
and what the inspector reflects from a database that ``jobrun.upgrade`` built
(SQLite and Postgres). The DDL compiled for each dialect is also compared as
text: the contract has one DDL for both engines.

The claim's index, ``_substrat_job_runs_claim_order``, is an expression index. The
Postgres inspector reflects it with its expression; SQLAlchemy cannot reflect
it from SQLite (it warns and leaves it out), so there it is read from SQLite's
own catalog instead: ``PRAGMA index_list`` / ``index_xinfo`` for its key
columns and ``sqlite_master`` for the expression's text.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Index, Table, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

import jobrun
from jobrun.sql.schema import (
    COMPAT_TABLE,
    VERSION_TABLE,
    concurrency_slots,
    job_pauses,
    job_retention,
    job_runs,
    job_schedules,
    job_steps,
    job_workers,
    limit_pauses,
    metadata,
    rate_buckets,
)
from tests.support import stored_index_ddl, unbracketed_terms

RUNS = "_substrat_job_runs"
STEPS = "_substrat_job_steps"
LIVE = "status = 'running'"
SCHEDULES = "_substrat_job_schedules"
BUCKETS = "_substrat_rate_buckets"
SLOTS = "_substrat_concurrency_slots"
RETENTION = "_substrat_job_retention"
WORKERS = "_substrat_job_workers"
JOB_PAUSES = "_substrat_job_pauses"
LIMIT_PAUSES = "_substrat_job_limit_pauses"
TABLES = (RUNS, STEPS, SCHEDULES, BUCKETS, SLOTS, RETENTION, WORKERS, JOB_PAUSES, LIMIT_PAUSES)
TABLE_OBJECTS = (
    job_runs,
    job_steps,
    job_schedules,
    rate_buckets,
    concurrency_slots,
    job_retention,
    job_workers,
    job_pauses,
    limit_pauses,
)
DUE_AT_INDEX = "_substrat_job_runs_claim_order"
DUE_AT = "coalesce(next_attempt_at, started_at)"
DUE_ORDER_INDEX = "_substrat_job_runs_due_order"
BY_AGE_ONLY = "priority IS NOT NULL"
JOB_KEY = ["substr(module_id, 1)", "substr(job, 1)"]
LIVE_BY_AGE_ONLY = f"{LIVE} AND {BY_AGE_ONLY}"
LEASED_INDEX = "_substrat_job_runs_leased"
LEASED = "lease_owner IS NOT NULL"

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
            # The lease (revision 0002): nullable, and a takeover count that starts at 0.
            ("lease_owner", "TEXT", True, None),
            ("lease_driver", "TEXT", True, None),
            ("lease_began_at", "TEXT", True, None),
            ("lease_takeovers", "INTEGER", False, "0"),
            # Revision 0003: the claim takes higher priorities first.
            ("priority", "INTEGER", False, "0"),
            # Revision 0004: the fencing epoch and the passes committed, from 0.
            ("lease_epoch", "INTEGER", False, "0"),
            ("passes_committed", "INTEGER", False, "0"),
            # Revision 0005: the passes deferred in a row, and the last one's reason.
            ("deferrals", "INTEGER", False, "0"),
            ("deferred_reason", "TEXT", True, None),
            # Revision 0006: the version of the code that last committed the run.
            ("job_version", "INTEGER", True, None),
            # Revision 0006: the cancelled marker.
            ("cancelled", "INTEGER", False, "0"),
            ("error_origin", "TEXT", True, None),
            # Revision 0009: when and why an operator paused the run.
            ("paused_at", "TEXT", True, None),
            ("pause_reason", "TEXT", True, None),
            # Revision 0010: the lease's expiry on its host's boot clock (SQLite).
            ("lease_boot_id", "TEXT", True, None),
            ("lease_boot_expires_ms", "BIGINT", True, None),
        ],
        "primary_key": ["id"],
        # (name, key columns or expressions, unique, partial predicate)
        "indexes": [
            # Revision 0011: the claim's orders, per job, live runs only.
            (DUE_AT_INDEX, [*JOB_KEY, "priority DESC", DUE_AT, "id"], False, LIVE),
            (DUE_ORDER_INDEX, [*JOB_KEY, DUE_AT, "id"], False, LIVE_BY_AGE_ONLY),
            # Revision 0006: the activity chart's range, the instance prefix's range.
            (
                "_substrat_job_runs_ended",
                ["ended_at", "status", "module_id", "job"],
                False,
                None,
            ),
            ("_substrat_job_runs_instance", ["instance", "id"], False, None),
            # Revision 0003: the console's newest-first ranges, by job and status, by status.
            ("_substrat_job_runs_job_status", ["module_id", "job", "status", "id"], False, None),
            ("_substrat_job_runs_key", ["module_id", "job", "instance", "id"], False, None),
            (LEASED_INDEX, ["module_id", "job"], False, LEASED),
            ("_substrat_job_runs_live_key", ["module_id", "job", "instance"], True, LIVE),
            ("_substrat_job_runs_status", ["status", "id"], False, None),
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
    # Revision 0003: how far each schedule has got (one row per schedule).
    SCHEDULES: {
        "columns": [
            ("module_id", "TEXT", False, None),
            ("job", "TEXT", False, None),
            ("schedule", "TEXT", False, None),
            ("last_slot_at", "TEXT", False, None),
            ("last_run_id", "TEXT", True, None),
            ("updated_at", "TEXT", False, None),
            # Revision 0005: the cron whose slots last_slot_at counts (NULL before).
            ("cron", "TEXT", True, None),
        ],
        "primary_key": ["module_id", "job", "schedule"],
        "indexes": [],
    },
    # Revision 0005: rate-limit buckets and concurrency slots.
    BUCKETS: {
        "columns": [
            ("limit_key", "TEXT", False, None),
            ("per_second", "TEXT", False, None),
            ("burst", "INTEGER", False, None),
            ("milli_tokens", "INTEGER", False, None),
            ("refilled_at", "TEXT", False, None),
            # Revision 0008: a limit cooling down (RetryAfter(rate_limit=)).
            ("cooling_until", "TEXT", True, None),
            ("cooling_reason", "TEXT", True, None),
        ],
        "primary_key": ["limit_key"],
        "indexes": [],
    },
    SLOTS: {
        "columns": [
            ("limit_key", "TEXT", False, None),
            ("lease_token", "TEXT", False, None),
            ("step", "TEXT", False, None),
            ("run_id", "TEXT", False, None),
            ("acquired_at", "TEXT", False, None),
        ],
        "primary_key": ["limit_key", "lease_token", "step"],
        "indexes": [],
    },
    # Revision 0005: each job's own keep_for, as the workers registering it said.
    RETENTION: {
        "columns": [
            ("module_id", "TEXT", False, None),
            ("job", "TEXT", False, None),
            ("keep_for_s", "INTEGER", False, None),
            ("updated_at", "TEXT", False, None),
        ],
        "primary_key": ["module_id", "job"],
        "indexes": [],
    },
    # Revision 0007: the workers that said they are alive.
    WORKERS: {
        "columns": [
            ("id", "TEXT", False, None),
            ("name", "TEXT", False, None),
            ("host", "TEXT", False, None),
            ("pid", "INTEGER", False, None),
            ("jobs", "TEXT", False, None),
            ("started_at", "TEXT", False, None),
            ("heartbeat_at", "TEXT", False, None),
            ("expires_at", "TEXT", False, None),
        ],
        "primary_key": ["id"],
        "indexes": [],
    },
    # Revision 0009: paused jobs and paused limit keys.
    JOB_PAUSES: {
        "columns": [
            ("module_id", "TEXT", False, None),
            ("job", "TEXT", False, None),
            ("paused_at", "TEXT", False, None),
            ("reason", "TEXT", True, None),
        ],
        "primary_key": ["module_id", "job"],
        "indexes": [],
    },
    LIMIT_PAUSES: {
        "columns": [
            ("limit_key", "TEXT", False, None),
            ("paused_at", "TEXT", False, None),
            ("reason", "TEXT", True, None),
        ],
        "primary_key": ["limit_key"],
        "indexes": [],
    },
}

DIALECTS = [sqlite.dialect(), postgresql.dialect()]

# SQLAlchemy cannot reflect an expression index from SQLite: its inspector warns
# and leaves the claim's two orders out. Those warnings are expected on SQLite
# (Postgres reflects the indexes); they are read from SQLite's catalog instead.
UNREFLECTABLE_ON_SQLITE = pytest.mark.filterwarnings(
    "ignore:Skipped unsupported reflection of expression-based index "
    f"({DUE_AT_INDEX}|{DUE_ORDER_INDEX})$"
    ":sqlalchemy.exc.SAWarning"
)
BACKENDS = [
    pytest.param("sqlite", id="sqlite", marks=UNREFLECTABLE_ON_SQLITE),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def _sql(value: Any) -> str | None:
    """One spelling for a default or a predicate, whoever wrote it.

    Postgres hands back what it stored: ``'{}'::text`` and ``(status = 'running'::text)``.
    """
    if value is None:
        return None
    found = " ".join(str(getattr(value, "text", value)).split())
    found = unbracketed_terms(re.sub(r"::[a-z ]+", "", found))
    while found.startswith("(") and found.endswith(")"):
        found = found[1:-1].strip()
    return found


def _element(value: str) -> str:
    """One spelling for an index's key expression: Postgres says ``COALESCE(...)``."""
    found = " ".join(value.split())
    return re.sub(r"\b[A-Za-z_]+(?=\()", lambda name: name[0].lower(), found)


def _type_name(type_: Any, dialect: Dialect) -> str:
    return str(type_.compile(dialect=dialect)).upper()


def _metadata_shape(table: Table, dialect: Dialect) -> dict[str, Any]:
    def predicate(index: Index) -> str | None:
        return _sql(index.dialect_options[dialect.name]["where"])

    def elements(index: Index) -> list[str]:
        # A key is a column or an expression; expressions are compiled as DDL
        # would print them (no table prefix).
        compiler = dialect.ddl_compiler(dialect, None).sql_compiler
        return [
            key.name
            if isinstance(key, Column)
            else _element(compiler.process(key, include_table=False, literal_binds=True))
            for key in index.expressions
        ]

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
            (index.name, elements(index), bool(index.unique), predicate(index))
            for index in table.indexes
        ),
    }


def _top_level_split(text: str) -> list[str]:
    """``a, f(b, c), d`` -> ``["a", "f(b, c)", "d"]``."""
    parts, depth, current = [], 0, ""
    for character in text:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += character
    parts.append(current.strip())
    return parts


def _sqlite_expression_indexes(connection: Connection, table: str) -> Iterator[Any]:
    """The indexes of ``table`` with an expression key, read from SQLite's catalog.

    ``PRAGMA index_xinfo`` gives every key's position and column (cid -2 marks an
    expression, with no name); ``sqlite_master`` keeps the CREATE INDEX text the
    index was made with, which is where the expression itself is written.
    """
    listed = connection.exec_driver_sql(f"PRAGMA index_list('{table}')").mappings().all()
    columns = {
        row["name"]
        for row in connection.exec_driver_sql(f"PRAGMA table_info('{table}')").mappings()
    }
    for entry in listed:
        keys = [
            row
            for row in connection.exec_driver_sql(f"PRAGMA index_xinfo('{entry['name']}')")
            .mappings()
            .all()
            if row["key"]
        ]
        if all(row["cid"] != -2 for row in keys):
            continue  # only columns: the inspector reflects it
        sql = connection.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (entry["name"],)
        ).scalar_one()
        head, _, predicate = " ".join(sql.split()).partition(" WHERE ")
        assert head.startswith(f"CREATE {'UNIQUE ' if entry['unique'] else ''}INDEX ")
        on = f" ON {table} ("
        assert on in head, sql
        assert head.endswith(")"), sql
        written = _top_level_split(head[head.index(on) + len(on) : -1])
        # The pragma and the text agree key by key: the same column where the
        # pragma names one, an expression (not a bare column) where it says -2.
        assert len(written) == len(keys), (written, keys)
        for row, key in zip(keys, written, strict=True):
            if row["cid"] >= 0:
                assert key == row["name"] + (" DESC" if row["desc"] else ""), (written, keys)
            else:
                assert row["cid"] == -2
                assert key not in columns, (written, keys)
        assert bool(entry["partial"]) == bool(predicate), sql
        yield (
            entry["name"],
            [_element(key) for key in written],
            bool(entry["unique"]),
            _sql(predicate) if predicate else None,
        )


def _reflected_shape(connection: Connection, table: str) -> dict[str, Any]:
    inspector = inspect(connection)
    dialect = connection.dialect

    def predicate(index: Any) -> str | None:
        options = index.get("dialect_options", {})
        return _sql(options.get(f"{dialect.name}_where"))

    def elements(index: Any) -> list[str]:
        # Postgres reflects expression keys ("expressions" lists every key) and a
        # descending key's direction apart ("column_sorting").
        sorting = index.get("column_sorting", {})
        return [
            _element(key) + (" DESC" if "desc" in sorting.get(key, ()) else "")
            for key in index.get("expressions") or index["column_names"]
        ]

    indexes = [
        (index["name"], elements(index), bool(index["unique"]), predicate(index))
        for index in inspector.get_indexes(table)
    ]
    if dialect.name == "sqlite":
        reflected = {index[0] for index in indexes}
        from_catalog = list(_sqlite_expression_indexes(connection, table))
        assert reflected.isdisjoint(index[0] for index in from_catalog)
        indexes += from_catalog

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
        "indexes": sorted(indexes),
        # Nothing beyond the indexes above: no unique constraint on the key, no
        # foreign keys (a crashed run must stay restartable; the ledger is bare).
        "unique_constraints": inspector.get_unique_constraints(table),
        "foreign_keys": inspector.get_foreign_keys(table),
    }


def _reflected_tables(connection: Connection) -> dict[str, Any]:
    names = set(inspect(connection).get_table_names())
    assert names == {*TABLES, VERSION_TABLE, COMPAT_TABLE}
    return {table: _reflected_shape(connection, table) for table in TABLES}


def _expected_reflection() -> dict[str, Any]:
    return {
        name: {**shape, "unique_constraints": [], "foreign_keys": []}
        for name, shape in EXPECTED.items()
    }


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
    assert set(metadata.tables) == set(TABLES)
    for dialect in DIALECTS:
        for table in TABLE_OBJECTS:
            assert _metadata_shape(table, dialect) == EXPECTED[table.name], dialect.name


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
    # The claim's order is an expression index, written the same on both engines.
    key = ", ".join(JOB_KEY)
    claim_order = f"({key}, priority DESC, {DUE_AT}, id) WHERE {LIVE}"
    assert f"CREATE INDEX {DUE_AT_INDEX} ON _substrat_job_runs {claim_order}" in on_sqlite
    due_order = f"({key}, {DUE_AT}, id) WHERE {LIVE_BY_AGE_ONLY}"
    assert f"CREATE INDEX {DUE_ORDER_INDEX} ON _substrat_job_runs {due_order}" in on_sqlite
    # The only unique thing on the key is that partial index.
    assert sum("UNIQUE" in statement for statement in on_sqlite) == 1


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_migrated_database_reflects_the_contracts_shape(migrated: AsyncEngine) -> None:
    assert await _reflect(migrated) == _expected_reflection()


@pytest.mark.postgres
@UNREFLECTABLE_ON_SQLITE
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
        for table in TABLE_OBJECTS:
            shape = _metadata_shape(table, dialect)
            assert {key: reflected[table.name][key] for key in shape} == shape


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_every_index_is_stored_as_the_metadata_writes_it(migrated: AsyncEngine) -> None:
    """Independent of reflection: the catalog's DDL of each index is the metadata's."""
    async with migrated.connect() as connection:
        stored = await connection.run_sync(stored_index_ddl, (RUNS, STEPS))
        dialect = connection.dialect
    expected = {
        str(index.name): " ".join(str(CreateIndex(index).compile(dialect=dialect)).split())
        for table in metadata.sorted_tables
        for index in table.indexes
    }
    assert stored == expected
    key = ", ".join(JOB_KEY)
    assert stored[DUE_AT_INDEX] == (
        f"CREATE INDEX {DUE_AT_INDEX} ON {RUNS} ({key}, priority DESC, {DUE_AT}, id) WHERE {LIVE}"
    )
    assert stored[DUE_ORDER_INDEX] == (
        f"CREATE INDEX {DUE_ORDER_INDEX} ON {RUNS} ({key}, {DUE_AT}, id) WHERE {LIVE_BY_AGE_ONLY}"
    )
    assert "_substrat_job_runs_due" not in stored, "revision 0002 replaced the 0001 due index"
    assert "_substrat_job_runs_due_at" not in stored, "revision 0003 replaced the 0002 index"


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
        # Column defaults come from the database, as the contract says; a run
        # nobody has claimed holds no lease and has had no takeover.
        defaults = await connection.execute(
            text(
                "SELECT counters, attempts, lease_owner, lease_driver, lease_began_at, "
                f"lease_takeovers FROM {RUNS}"
            )
        )
        assert set(defaults.all()) == {("{}", 0, None, None, None, 0)}
    with pytest.raises(IntegrityError):
        async with migrated.begin() as connection:
            await connection.execute(insert, _row("9" * 26, "running"))
    async with migrated.begin() as connection:
        # Another instance of the same job is another key.
        await connection.execute(insert, {**_row("8" * 26, "running"), "instance": "other"})
        live = await connection.execute(text(f"SELECT count(*) FROM {RUNS} WHERE {LIVE}"))
        assert live.scalar_one() == 2
