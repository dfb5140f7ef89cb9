"""``alembic`` without the checkout: the ini from ``jobrun db alembic-ini``, and a host's own env.

Everything runs in a temporary directory as a new user would: the ``alembic``
program in a subprocess, the URL given the ways the ini's comments promise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
import jobrun._cli.commands.db  # registers the db commands on the group
from jobrun._cli.app import cli
from jobrun.sql.schema import COMPAT_TABLE, SCHEMA_REVISION, VERSION_TABLE
from tests.support import SQL_BACKENDS, revision_of, run_alembic


async def alembic(cwd: Path, *args: str, **env: str) -> tuple[int, str]:
    environment = {key: value for key, value in os.environ.items() if key != "JOBRUN_DATABASE_URL"}
    environment.pop("PYTHONPATH", None)
    environment.update(env)
    return await run_alembic(*args, env=environment, cwd=cwd, timeout_s=90)


def short(url: str) -> str:
    """The URL as a user types it: no driver named."""
    return url.replace("+aiosqlite", "").replace("+asyncpg", "")


async def tables_of(url: str) -> dict[str, list[str]]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: {
                    name: [column["name"] for column in inspect(sync).get_columns(name)]
                    for name in inspect(sync).get_table_names()
                }
            )
    finally:
        await engine.dispose()


def append_line(path: Path, line: str) -> None:
    path.write_text(path.read_text() + line + "\n")


@pytest.fixture
def ini(tmp_path: Path) -> Path:
    result = CliRunner().invoke(cli, ["db", "alembic-ini"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "[loggers]" not in result.output  # minimal: env.py must cope without logging
    path = tmp_path / "elsewhere" / "jobrun-alembic.ini"
    path.parent.mkdir()
    path.write_text(result.output)
    return path


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_alembic_with_the_printed_ini_upgrades_reports_and_downgrades(
    ini: Path, blank_url: str
) -> None:
    where, url = ini.parent, short(blank_url)
    code, output = await alembic(where, "-c", ini.name, "-x", f"url={url}", "upgrade", "head")
    assert code == 0, output
    tables = await tables_of(blank_url)
    assert {"_substrat_job_runs", "_substrat_job_steps", VERSION_TABLE} <= set(tables)
    assert "alembic_version" not in tables
    code, output = await alembic(where, "-c", ini.name, "-x", f"url={url}", "current")
    assert code == 0, output
    assert f"{SCHEMA_REVISION} (head)" in output, output
    code, output = await alembic(where, "-c", ini.name, "history")
    assert code == 0, output
    assert "<base> -> 0001" in output, output
    # The URL from the environment this time.
    code, output = await alembic(
        where, "-c", ini.name, "downgrade", "base", JOBRUN_DATABASE_URL=url
    )
    assert code == 0, output
    assert set(await tables_of(blank_url)) == {VERSION_TABLE}


async def test_the_ini_url_is_used_and_a_missing_url_is_named(ini: Path) -> None:
    database = ini.parent / "from-ini.db"
    code, output = await alembic(ini.parent, "-c", ini.name, "upgrade", "head")
    assert code != 0, output
    assert "no database URL" in output, output
    append_line(ini, f"sqlalchemy.url = sqlite:///{database}")
    code, output = await alembic(ini.parent, "-c", ini.name, "upgrade", "head")
    assert code == 0, output
    assert database.exists()
    code, output = await alembic(ini.parent, "-c", ini.name, "current")
    assert f"{SCHEMA_REVISION} (head)" in output, output


HOST_ENV = """
import asyncio
import os

from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table, Text
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

target_metadata = MetaData()
Table("host_items", target_metadata, Column("id", Integer, primary_key=True), Column("name", Text))


def run(connection):
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=jobrun.skip_jobrun_tables,
    )
    with context.begin_transaction():
        context.run_migrations()
        # jobrun's tables, on the host's connection and in its transaction.
        jobrun.migrate_on_connection(connection)


async def main():
    engine = create_async_engine(os.environ["HOST_DATABASE_URL"])
    async with engine.connect() as connection:
        await connection.run_sync(run)
        await connection.commit()
    await engine.dispose()


asyncio.run(main())
"""

HOST_REVISION = '''
"""host items

Revision ID: h1
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "h1"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "host_items", sa.Column("id", sa.Integer(), primary_key=True), sa.Column("name", sa.Text())
    )


def downgrade():
    op.drop_table("host_items")
'''


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
async def test_a_host_alembic_env_runs_jobrun_migrations_and_autogenerate_leaves_them(
    tmp_path: Path, blank_url: str
) -> None:
    host = tmp_path / "host"
    (host / "migrations" / "versions").mkdir(parents=True)
    (host / "alembic.ini").write_text(
        "[alembic]\nscript_location = %(here)s/migrations\npath_separator = os\n"
    )
    (host / "migrations" / "env.py").write_text(HOST_ENV)
    (host / "migrations" / "script.py.mako").write_text(
        (Path(jobrun.__file__).parents[1] / "migrations" / "script.py.mako").read_text()
    )
    (host / "migrations" / "versions" / "h1_host_items.py").write_text(HOST_REVISION)
    env = {"HOST_DATABASE_URL": blank_url}

    code, output = await alembic(host, "upgrade", "head", **env)
    assert code == 0, output
    tables = await tables_of(blank_url)
    assert {"host_items", "alembic_version", VERSION_TABLE, "_substrat_job_runs"} <= set(tables)
    code, output = await alembic(host, "current", **env)
    assert code == 0, output
    assert "h1 (head)" in output, output  # the host's history is its own
    engine = create_async_engine(blank_url)
    try:
        assert await revision_of(engine) == SCHEMA_REVISION
        # Running the host's upgrade again is a no-op for both histories.
        code, output = await alembic(host, "upgrade", "head", **env)
        assert code == 0, output
        # The host's autogenerate sees jobrun's tables in the database but not in its
        # metadata: with the filter it proposes nothing for them.
        code, output = await alembic(host, "revision", "--autogenerate", "-m", "check", **env)
        assert code == 0, output
        generated = next((host / "migrations" / "versions").glob("*_check.py")).read_text()
        assert "_substrat_job" not in generated, generated
        assert VERSION_TABLE not in generated, generated
        assert COMPAT_TABLE not in generated, generated
        upgrade_body = generated.split("def upgrade")[1].split("def downgrade")[0]
        assert "pass" in upgrade_body, upgrade_body
        # jobrun's own check still finds its tables exactly at head.
        store = jobrun.SqlJobRunStore(engine)
        run = await jobrun.start_job_run(store, module_id="host", job="j")
        assert run.status == "running"
    finally:
        await engine.dispose()


def test_skip_jobrun_tables_keeps_the_hosts_objects_only() -> None:
    from sqlalchemy import Column, Integer, MetaData, Table

    from jobrun.sql.schema import job_runs

    host = Table("host_items", MetaData(), Column("id", Integer))
    assert jobrun.skip_jobrun_tables(host, "host_items", "table", True, None)
    assert not jobrun.skip_jobrun_tables(job_runs, job_runs.name, "table", True, None)
    assert not jobrun.skip_jobrun_tables(None, VERSION_TABLE, "table", True, None)
    assert not jobrun.skip_jobrun_tables(None, COMPAT_TABLE, "table", True, None)
    index = next(iter(job_runs.indexes))
    assert not jobrun.skip_jobrun_tables(index, index.name, "index", True, None)
    assert jobrun.skip_jobrun_tables(host.c.id, "id", "column", True, None)
    assert not jobrun.skip_jobrun_tables(job_runs.c.status, "status", "column", True, None)
