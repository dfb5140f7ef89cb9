"""jobrun's Alembic revisions: one head, exactly the metadata, only jobrun's tables.

Every database test runs on SQLite (a file) and on Postgres (an empty database).
Walking every revision up and down on populated databases is test_migration_walk.py.

Alembic's autogenerate comparison cannot see the claim's expression index on
SQLite (SQLAlchemy does not reflect expression indexes there), so ``_diff`` also
compares every index's DDL as the database's own catalog keeps it.
"""

from __future__ import annotations

import asyncio
import io
import logging
import multiprocessing
import os
import re
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Index, Integer, MetaData, func, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

import jobrun
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION, VERSION_TABLE, metadata
from jobrun.sql.upgrades.migrate import (
    alembic_config,
    downgrade,
    head_revision,
    migrations_directory,
)
from tests.support import REPO, SQL_BACKENDS, revision_of, run_alembic, stored_index_ddl

JOBRUN_TABLES = {
    "_substrat_job_runs",
    "_substrat_job_steps",
    "_substrat_job_schedules",
    # Revision 0005: the limits.
    "_substrat_rate_buckets",
    "_substrat_concurrency_slots",
    # Revision 0005: each job's own keep_for.
    "_substrat_job_retention",
    # Revision 0007: the workers that said they are alive.
    "_substrat_job_workers",
    # Revision 0009: paused jobs and paused limit keys.
    "_substrat_job_pauses",
    "_substrat_job_limit_pauses",
}
DUE_AT_INDEX = "_substrat_job_runs_claim_order"
DUE_ORDER_INDEX = "_substrat_job_runs_due_order"
# Either expression index, in a warning filter (the claim's two orders, 0003 and 0005).
EXPRESSION_INDEXES = f"({DUE_AT_INDEX}|{DUE_ORDER_INDEX})"

# Autogenerate on SQLite cannot compare the expression indexes (the claim's two orders):
# SQLAlchemy's inspector warns that it skips reflecting each, and Alembic that it
# therefore skips comparing each. Exactly these warnings are expected in the SQLite
# tests that call ``_diff``, which checks those indexes from SQLite's catalog instead.
REFLECTION_SKIPPED = pytest.mark.filterwarnings(
    f"ignore:Skipped unsupported reflection of expression-based index {EXPRESSION_INDEXES}$"
    ":sqlalchemy.exc.SAWarning"
)
COMPARISON_SKIPPED = pytest.mark.filterwarnings(
    "ignore:autogenerate skipping metadata-specified expression-based index "
    f"'{EXPRESSION_INDEXES}'"
    ":UserWarning"
)
CANNOT_COMPARE_ON_SQLITE = [REFLECTION_SKIPPED, COMPARISON_SKIPPED]
DIFF_BACKENDS = [
    pytest.param("sqlite", id="sqlite", marks=CANNOT_COMPARE_ON_SQLITE),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return set(await connection.run_sync(lambda sync: inspect(sync).get_table_names()))


async def _version_rows(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        return list(rows.scalars())


def _jobrun_tables_only(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    return type_ != "table" or name in JOBRUN_TABLES


def _index_ddl(target: MetaData, dialect: Dialect) -> dict[str, str]:
    return {
        str(index.name): " ".join(str(CreateIndex(index).compile(dialect=dialect)).split())
        for table in target.tables.values()
        for index in table.indexes
    }


async def _diff(engine: AsyncEngine, target: MetaData = metadata) -> list[Any]:
    """Alembic's autogenerate diff between the database and ``target``, plus index DDL.

    Note: Alembic compares an index by name, uniqueness and columns only; the
    WHERE clause of a partial index is not part of its comparison (Alembic
    1.20, ``DefaultImpl.compare_indexes``; its docs list only "basic changes in
    indexes" among what autogenerate detects), and on SQLite it skips expression
    indexes altogether. So each index's stored DDL is compared too, and any
    difference is reported as ``("index_ddl", name, stored, expected)``. The
    predicate is also checked by reflection in test_schema.py and by
    ``test_offline_sql_is_the_metadatas_ddl``.
    """

    def compare(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection,
            opts={
                "version_table": VERSION_TABLE,
                "include_object": _jobrun_tables_only,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        found = list(compare_metadata(context, target))
        stored = stored_index_ddl(connection, JOBRUN_TABLES)
        expected = _index_ddl(target, connection.dialect)
        found.extend(
            ("index_ddl", name, stored.get(name), expected.get(name))
            for name in sorted(stored.keys() | expected.keys())
            if stored.get(name) != expected.get(name)
        )
        return found

    async with engine.connect() as connection:
        return await connection.run_sync(compare)


async def _create_host_tables(engine: AsyncEngine) -> None:
    """A host that shares the database and keeps its own Alembic history there."""
    async with engine.begin() as connection:
        await connection.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)"))
        await connection.execute(text("INSERT INTO orders (id, item) VALUES (1, 'tea')"))
        await connection.execute(
            text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        )
        await connection.execute(text("INSERT INTO alembic_version VALUES ('host_rev_42')"))


async def _host_state(engine: AsyncEngine) -> tuple[list[Any], list[Any]]:
    async with engine.connect() as connection:
        orders = (await connection.execute(text("SELECT id, item FROM orders"))).all()
        versions = (await connection.execute(text("SELECT version_num FROM alembic_version"))).all()
    return [tuple(row) for row in orders], [tuple(row) for row in versions]


async def _insert_run(engine: AsyncEngine, run_id: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO _substrat_job_runs (id, module_id, job, instance, payload, status, "
                "started_at, updated_at) VALUES (:id, 'm', 'j', 'default', 'null', 'done', "
                "'2024-01-01T00:00:00.000Z', '2024-01-01T00:00:00.000Z')"
            ),
            {"id": run_id},
        )


def test_one_head_and_it_is_the_schema_revision() -> None:
    scripts = ScriptDirectory.from_config(alembic_config())
    assert scripts.get_heads() == [SCHEMA_REVISION]
    assert head_revision() == SCHEMA_REVISION
    assert len(scripts.get_bases()) == 1
    # In a checkout the environment is the repository's migrations/ directory,
    # the same one alembic.ini names.
    assert migrations_directory() == REPO / "migrations"


@pytest.mark.parametrize("blank_url", DIFF_BACKENDS, indirect=True)
async def test_upgrade_builds_exactly_the_metadata(blank: AsyncEngine) -> None:
    assert await revision_of(blank) is None
    await jobrun.upgrade(blank)
    assert await revision_of(blank) == SCHEMA_REVISION
    assert await _tables(blank) == JOBRUN_TABLES | {VERSION_TABLE, COMPAT_TABLE}
    assert await _diff(blank) == []
    # The comparison can see a difference (it is not vacuous, e.g. filtered to nothing),
    # the claim's expression index included: here it orders by the other coalesce.
    drifted = MetaData()
    for table in metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["_substrat_job_steps"].append_column(Column("extra", Integer))
    runs = drifted.tables["_substrat_job_runs"]
    runs.c.counters.server_default = None
    (due_at,) = (index for index in runs.indexes if index.name == DUE_AT_INDEX)
    runs.indexes.remove(due_at)
    Index(DUE_AT_INDEX, runs.c.status, func.coalesce(runs.c.started_at, runs.c.next_attempt_at))
    changes = await _diff(blank, drifted)
    kinds = sorted(change[0][0] if isinstance(change, list) else change[0] for change in changes)
    if blank.dialect.name == "postgresql":
        # Postgres reflects expression indexes, so Alembic sees this change itself.
        assert kinds == [
            "add_column",
            "add_index",
            "index_ddl",
            "modify_default",
            "remove_index",
        ]
    else:
        assert kinds == ["add_column", "index_ddl", "modify_default"]
    (index_change,) = (change for change in changes if change[0] == "index_ddl")
    assert index_change[1] == DUE_AT_INDEX
    assert "coalesce(next_attempt_at, started_at), id)" in index_change[2]


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_host_tables_and_host_alembic_version_are_left_alone(blank: AsyncEngine) -> None:
    await _create_host_tables(blank)
    before = await _host_state(blank)
    await jobrun.upgrade(blank)
    assert (
        await _tables(blank)
        == {"orders", "alembic_version", VERSION_TABLE, COMPAT_TABLE} | JOBRUN_TABLES
    )
    assert await _host_state(blank) == before
    assert await _version_rows(blank) == [SCHEMA_REVISION]
    await downgrade(blank)
    assert await _tables(blank) == {"orders", "alembic_version", VERSION_TABLE}
    assert await _host_state(blank) == before
    assert before == ([(1, "tea")], [("host_rev_42",)])


@pytest.mark.parametrize("blank_url", DIFF_BACKENDS, indirect=True)
async def test_upgrade_is_idempotent_and_keeps_data(blank: AsyncEngine) -> None:
    await jobrun.upgrade(blank)
    await _insert_run(blank, "0" * 26)
    await jobrun.upgrade(blank)
    await jobrun.upgrade(blank, SCHEMA_REVISION)
    assert await _version_rows(blank) == [SCHEMA_REVISION]
    assert await _diff(blank) == []
    # A store works on it, and sees the run written before the repeated upgrades.
    run = await jobrun.get_job_run(jobrun.SqlJobRunStore(blank), "0" * 26)
    assert run is not None
    assert run.status == "done"


def _upgrade_in_process(url: str, barrier: Any, outcomes: Any) -> None:
    async def upgrade() -> None:
        engine = create_async_engine(url)
        try:
            async with engine.connect():
                pass  # connected before the race
            await asyncio.to_thread(barrier.wait, 60)
            await jobrun.upgrade(engine)
        finally:
            await engine.dispose()

    try:
        asyncio.run(upgrade())
    except BaseException as error:
        outcomes.put(f"{type(error).__name__}: {error}")
    else:
        outcomes.put(None)


@pytest.mark.slow
@pytest.mark.parametrize("blank_url", DIFF_BACKENDS, indirect=True)
async def test_workers_upgrading_one_database_at_once_all_succeed(
    blank_url: str, blank: AsyncEngine
) -> None:
    """Worker processes that all call ``jobrun.upgrade`` at start-up take turns; none fails."""
    workers = 4
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    outcomes = context.Queue()
    processes = [
        context.Process(
            target=_upgrade_in_process, args=(blank_url, barrier, outcomes), daemon=True
        )
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        found = [await asyncio.to_thread(outcomes.get, True, 90) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        outcomes.close()
        outcomes.join_thread()
    assert found == [None] * workers
    assert await _version_rows(blank) == [SCHEMA_REVISION]
    assert await _diff(blank) == []


async def test_upgrades_of_several_databases_in_one_event_loop(tmp_path: Path) -> None:
    """Alembic's module-level state must not let concurrent upgrades mix up their databases."""
    engines = [create_async_engine(f"sqlite+aiosqlite:///{tmp_path / f'{n}.db'}") for n in range(4)]
    try:
        await asyncio.gather(*(jobrun.upgrade(engine) for engine in engines))
        for engine in engines:
            assert await _tables(engine) == JOBRUN_TABLES | {VERSION_TABLE, COMPAT_TABLE}
            assert await _version_rows(engine) == [SCHEMA_REVISION]
    finally:
        for engine in engines:
            await engine.dispose()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_failed_upgrade_leaves_nothing_behind(blank: AsyncEngine) -> None:
    # A host table in the way of the revision's last CREATE TABLE.
    async with blank.begin() as connection:
        await connection.execute(text("CREATE TABLE _substrat_job_steps (x INTEGER)"))
    with pytest.raises(SQLAlchemyError, match="_substrat_job_steps"):
        await jobrun.upgrade(blank)
    # One transaction: the tables created before the failure are gone again.
    assert await _tables(blank) == {"_substrat_job_steps"}


def _one_line(ddl: object) -> str:
    return " ".join(str(ddl).split())


def _replay(statements: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """What a chain of jobrun DDL statements leaves: each table's and index's DDL.

    A column added later is folded into its table's CREATE TABLE, after the
    columns already there, as the database would show the table afterwards.
    """
    tables: dict[str, str] = {}
    indexes: dict[str, str] = {}
    for statement in statements:
        if match := re.fullmatch(r"CREATE TABLE (\w+) \(.*\)", statement):
            tables[match[1]] = statement
        elif match := re.fullmatch(r"ALTER TABLE (\w+) ADD COLUMN (.+)", statement):
            columns, constraints, tail = tables[match[1]].rpartition(", PRIMARY KEY")
            tables[match[1]] = f"{columns}, {match[2]}{constraints}{tail}"
        elif match := re.fullmatch(r"CREATE (?:UNIQUE )?INDEX (\w+) ON .+", statement):
            indexes[match[1]] = statement
        elif match := re.fullmatch(r"DROP INDEX (\w+)", statement):
            del indexes[match[1]]
        elif statement.startswith("UPDATE "):
            continue  # a data migration (0006 marks the runs cancelled before it)
        else:
            raise AssertionError(f"unexpected DDL on jobrun's tables: {statement}")
    return tables, indexes


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()], ids=lambda d: d.name)
def test_offline_sql_is_the_metadatas_ddl(
    dialect: Dialect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The revisions' DDL, rendered by ``alembic upgrade --sql``, builds the metadata verbatim.

    Replayed in order (0001 creates, 0002 adds the lease columns and swaps the
    due index for the expression index), the statements leave exactly the
    metadata's CREATE TABLE and CREATE INDEX text. This is what covers the
    partial index's WHERE clause and the index expression on both dialects
    without a server, where autogenerate's comparison cannot (see ``_diff``).
    """
    url = {"sqlite": "sqlite+aiosqlite:///unused.db", "postgresql": "postgresql+asyncpg://x/y"}
    monkeypatch.setenv("JOBRUN_DATABASE_URL", url[dialect.name])
    config = alembic_config()
    config.output_buffer = io.StringIO()
    command.upgrade(config, "head", sql=True)
    script = config.output_buffer.getvalue()
    statements = "\n".join(line for line in script.splitlines() if not line.startswith("--"))
    rendered = [_one_line(part) for part in statements.split(";")]
    tables, indexes = _replay([part for part in rendered if "_substrat_" in part])
    assert tables == {
        table.name: _one_line(CreateTable(table).compile(dialect=dialect))
        for table in metadata.sorted_tables
    }
    assert indexes == _index_ddl(metadata, dialect)
    assert "WHERE status = 'running'" in indexes["_substrat_job_runs_live_key"]
    # Revision 0011: the claim's order, per job, live runs only.
    assert (
        "(substr(module_id, 1), substr(job, 1), priority DESC, coalesce(next_attempt_at, "
        "started_at), id) WHERE status = 'running'"
    ) in indexes[DUE_AT_INDEX]
    assert f"CREATE TABLE {VERSION_TABLE}" in script
    # Revision 0006: the compatibility record, created with its row.
    assert f"CREATE TABLE {COMPAT_TABLE}" in script
    assert f"INSERT INTO {COMPAT_TABLE} (oldest_code_revision) VALUES ('0006')" in script
    assert f"SET version_num='{SCHEMA_REVISION}'" in script
    assert "CREATE TABLE alembic_version" not in script


async def _alembic(*args: str, database_url: str | None = None) -> tuple[int, str]:
    """``alembic ...`` as a user would type it at the repository root."""
    env = {key: value for key, value in os.environ.items() if key != "JOBRUN_DATABASE_URL"}
    if database_url is not None:
        env["JOBRUN_DATABASE_URL"] = database_url
    return await run_alembic(*args, env=env)


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_alembic_command_line_with_x_url(blank_url: str, blank: AsyncEngine) -> None:
    code, output = await _alembic("-x", f"url={blank_url}", "upgrade", "head")
    assert code == 0, output
    # From the command line, alembic.ini's logging set-up applies: Alembic says what it ran.
    assert "INFO  [alembic.runtime.migration] Running upgrade  -> 0001" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0001 -> 0002" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0002 -> 0003" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0003 -> 0004" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0004 -> 0005" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0005 -> 0006" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0006 -> 0007" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0007 -> 0008" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0008 -> 0009" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0009 -> 0010" in output
    assert "INFO  [alembic.runtime.migration] Running upgrade 0010 -> 0011" in output
    assert SCHEMA_REVISION == "0011"  # a new revision adds its line above
    assert await _tables(blank) == JOBRUN_TABLES | {VERSION_TABLE, COMPAT_TABLE}
    assert await revision_of(blank) == SCHEMA_REVISION
    code, output = await _alembic("-x", f"url={blank_url}", "current")
    assert code == 0, output
    assert f"{SCHEMA_REVISION} (head)" in output
    code, output = await _alembic("-x", f"url={blank_url}", "downgrade", "base")
    assert code == 0, output
    assert await _tables(blank) == {VERSION_TABLE}


@REFLECTION_SKIPPED  # a SQLite database, compared by _diff
@COMPARISON_SKIPPED
async def test_alembic_command_line_with_environment_url(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'from-env.db'}"
    code, output = await _alembic("upgrade", "head", database_url=url)
    assert code == 0, output
    engine = create_async_engine(url)
    try:
        assert await _tables(engine) == JOBRUN_TABLES | {VERSION_TABLE, COMPAT_TABLE}
        assert await revision_of(engine) == SCHEMA_REVISION
        assert await _diff(engine) == []
    finally:
        await engine.dispose()


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_failed_command_line_upgrade_leaves_nothing_behind(
    blank_url: str, blank: AsyncEngine
) -> None:
    """The command line migrates in one transaction too (on SQLite as well)."""
    async with blank.begin() as connection:
        await connection.execute(text("CREATE TABLE _substrat_job_steps (x INTEGER)"))
    code, output = await _alembic("-x", f"url={blank_url}", "upgrade", "head")
    assert code != 0
    assert "_substrat_job_steps" in output
    assert await _tables(blank) == {"_substrat_job_steps"}


def _logging_state() -> list[Any]:
    loggers = [logging.getLogger(name) for name in ("", "alembic", "sqlalchemy.engine", "host")]
    return [(list(log.handlers), log.level, log.propagate, log.disabled) for log in loggers]


async def test_jobrun_upgrade_leaves_the_hosts_logging_alone(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Inside a host's process the logging set-up is the host's: no handler, level or
    disabled logger changes, and nothing is printed, even when the Alembic config
    that carries the connection also names an ini file with logging sections."""
    logging.getLogger("host").info("a logger the host made before migrating")
    before = _logging_state()
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'quiet.db'}")
    try:
        await jobrun.upgrade(engine)
        await downgrade(engine, "0001")

        def with_ini_file(connection: Connection) -> None:
            config = alembic_config(connection)
            config.config_file_name = str(REPO / "alembic.ini")
            command.upgrade(config, "head")

        async with engine.begin() as connection:
            await connection.run_sync(with_ini_file)
        assert await revision_of(engine) == SCHEMA_REVISION
    finally:
        await engine.dispose()
    assert _logging_state() == before
    assert capfd.readouterr() == ("", "")


async def test_alembic_command_line_without_url_fails_clearly(tmp_path: Path) -> None:
    code, output = await _alembic("upgrade", "head")
    assert code != 0
    assert "no database URL" in output
    assert "-x url=" in output
    assert "JOBRUN_DATABASE_URL" in output
    assert "Traceback" not in output
