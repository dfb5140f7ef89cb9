"""jobrun's Alembic revisions: one head, exactly the metadata, only jobrun's tables.

Every database test runs on SQLite (a file) and on Postgres (an empty database).
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, MetaData, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

import jobrun
from jobrun.sql.migrate import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    migrations_directory,
)
from jobrun.sql.schema import SCHEMA_REVISION, VERSION_TABLE, metadata

REPO = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).with_name("alembic")
JOBRUN_TABLES = {"_substrat_job_runs", "_substrat_job_steps"}
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on the requested backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'migrations.db'}"
    return str(request.getfixturevalue("empty_postgres_url"))


@pytest.fixture
async def blank(blank_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(blank_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return set(await connection.run_sync(lambda sync: inspect(sync).get_table_names()))


async def _revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(current_revision)


async def _version_rows(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        return list(rows.scalars())


def _jobrun_tables_only(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    return type_ != "table" or name in JOBRUN_TABLES


async def _diff(engine: AsyncEngine, target: MetaData = metadata) -> list[Any]:
    """Alembic's autogenerate diff between the database and ``target``.

    Note: Alembic compares an index by name, uniqueness and columns only; the
    WHERE clause of a partial index is not part of its comparison (Alembic
    1.20, ``DefaultImpl.compare_indexes``; its docs list only "basic changes in
    indexes" among what autogenerate detects). The predicate is checked by
    reflection in test_schema.py and by ``test_offline_sql_is_the_metadatas_ddl``.
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
        return list(compare_metadata(context, target))

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


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_upgrade_builds_exactly_the_metadata(blank: AsyncEngine) -> None:
    assert await _revision(blank) is None
    await jobrun.upgrade(blank)
    assert await _revision(blank) == SCHEMA_REVISION
    assert await _tables(blank) == JOBRUN_TABLES | {VERSION_TABLE}
    assert await _diff(blank) == []
    # The comparison can see a difference (it is not vacuous, e.g. filtered to nothing).
    drifted = MetaData()
    for table in metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["_substrat_job_steps"].append_column(Column("extra", Integer))
    drifted.tables["_substrat_job_runs"].c.counters.server_default = None
    kinds = sorted(
        change[0][0] if isinstance(change, list) else change[0]
        for change in await _diff(blank, drifted)
    )
    assert kinds == ["add_column", "modify_default"]


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_host_tables_and_host_alembic_version_are_left_alone(blank: AsyncEngine) -> None:
    await _create_host_tables(blank)
    before = await _host_state(blank)
    await jobrun.upgrade(blank)
    assert await _tables(blank) == {"orders", "alembic_version", VERSION_TABLE} | JOBRUN_TABLES
    assert await _host_state(blank) == before
    assert await _version_rows(blank) == [SCHEMA_REVISION]
    await downgrade(blank)
    assert await _tables(blank) == {"orders", "alembic_version", VERSION_TABLE}
    assert await _host_state(blank) == before
    assert before == ([(1, "tea")], [("host_rev_42",)])


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_downgrade_to_base_and_upgrade_again(blank: AsyncEngine) -> None:
    await jobrun.upgrade(blank)
    await _insert_run(blank, "0" * 26)
    await downgrade(blank)
    assert await _tables(blank) == {VERSION_TABLE}
    assert await _revision(blank) is None
    assert await _version_rows(blank) == []
    await jobrun.upgrade(blank)
    assert await _tables(blank) == JOBRUN_TABLES | {VERSION_TABLE}
    assert await _revision(blank) == SCHEMA_REVISION
    assert await _diff(blank) == []
    async with blank.connect() as connection:
        runs = await connection.execute(text("SELECT count(*) FROM _substrat_job_runs"))
        assert runs.scalar_one() == 0


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
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
@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
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
            assert await _tables(engine) == JOBRUN_TABLES | {VERSION_TABLE}
            assert await _version_rows(engine) == [SCHEMA_REVISION]
    finally:
        for engine in engines:
            await engine.dispose()


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_a_failed_upgrade_leaves_nothing_behind(blank: AsyncEngine) -> None:
    # A host table in the way of the revision's last CREATE TABLE.
    async with blank.begin() as connection:
        await connection.execute(text("CREATE TABLE _substrat_job_steps (x INTEGER)"))
    with pytest.raises(SQLAlchemyError, match="_substrat_job_steps"):
        await jobrun.upgrade(blank)
    # One transaction: the tables created before the failure are gone again.
    assert await _tables(blank) == {"_substrat_job_steps"}


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()], ids=lambda d: d.name)
def test_offline_sql_is_the_metadatas_ddl(
    dialect: Dialect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The revision's DDL, rendered by ``alembic upgrade --sql``, is the metadata's, verbatim.

    This is what covers the partial index's WHERE clause on both dialects
    without a server, where autogenerate's comparison cannot (see ``_diff``).
    """
    url = {"sqlite": "sqlite+aiosqlite:///unused.db", "postgresql": "postgresql+asyncpg://x/y"}
    monkeypatch.setenv("JOBRUN_DATABASE_URL", url[dialect.name])
    config = alembic_config()
    config.output_buffer = io.StringIO()
    command.upgrade(config, "head", sql=True)
    script = config.output_buffer.getvalue()
    statements = "\n".join(line for line in script.splitlines() if not line.startswith("--"))
    rendered = [" ".join(part.split()) for part in statements.split(";")]
    jobrun_ddl = [part for part in rendered if "_substrat_job_" in part]
    expected = []
    for table in metadata.sorted_tables:
        expected.append(str(CreateTable(table).compile(dialect=dialect)))
        expected.extend(str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes)
    assert sorted(jobrun_ddl) == sorted(" ".join(part.split()) for part in expected)
    assert any("WHERE status = 'running'" in part for part in jobrun_ddl)
    assert f"CREATE TABLE {VERSION_TABLE}" in script
    assert "CREATE TABLE alembic_version" not in script


async def _alembic(*args: str, database_url: str | None = None) -> tuple[int, str]:
    """``alembic ...`` as a user would type it at the repository root."""
    env = {key: value for key, value in os.environ.items() if key != "JOBRUN_DATABASE_URL"}
    if database_url is not None:
        env["JOBRUN_DATABASE_URL"] = database_url
    process = await asyncio.create_subprocess_exec(
        str(ALEMBIC),
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode or 0, output.decode()


@pytest.mark.parametrize("blank_url", BACKENDS, indirect=True)
async def test_alembic_command_line_with_x_url(blank_url: str, blank: AsyncEngine) -> None:
    code, output = await _alembic("-x", f"url={blank_url}", "upgrade", "head")
    assert code == 0, output
    assert await _tables(blank) == JOBRUN_TABLES | {VERSION_TABLE}
    assert await _revision(blank) == SCHEMA_REVISION
    code, output = await _alembic("-x", f"url={blank_url}", "current")
    assert code == 0, output
    assert f"{SCHEMA_REVISION} (head)" in output
    code, output = await _alembic("-x", f"url={blank_url}", "downgrade", "base")
    assert code == 0, output
    assert await _tables(blank) == {VERSION_TABLE}


async def test_alembic_command_line_with_environment_url(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'from-env.db'}"
    code, output = await _alembic("upgrade", "head", database_url=url)
    assert code == 0, output
    engine = create_async_engine(url)
    try:
        assert await _tables(engine) == JOBRUN_TABLES | {VERSION_TABLE}
        assert await _revision(engine) == SCHEMA_REVISION
        assert await _diff(engine) == []
    finally:
        await engine.dispose()


async def test_alembic_command_line_without_url_fails_clearly(tmp_path: Path) -> None:
    code, output = await _alembic("upgrade", "head")
    assert code != 0
    assert "no database URL" in output
    assert "-x url=" in output
    assert "JOBRUN_DATABASE_URL" in output
    assert "Traceback" not in output
