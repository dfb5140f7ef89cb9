"""``jobrun db``: upgrade, current, check (jobrun/_cli/commands/db.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.upgrades.migrate import downgrade
from tests.processes.cli_support import execute, fails, file_url, ok
from tests.support import SQL_BACKENDS, run_in_thread


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


def _db_upgrade_current_check(url: str) -> None:
    assert "no jobrun schema" in fails(1, "db", "check", "--url", url).stdout
    assert "upgraded from none" in ok("db", "upgrade", "--url", url).stdout
    assert f"already at head: {SCHEMA_REVISION}" in ok("db", "upgrade", "--url", url).stdout
    current = ok("db", "current", "--url", url).stdout
    assert f"current: {SCHEMA_REVISION}" in current
    assert f"head:    {SCHEMA_REVISION}" in current
    assert f"ok: at head {SCHEMA_REVISION}" in ok("db", "check", "--url", url).stdout


def test_db_upgrade_on_a_new_sqlite_file(tmp_path: Path) -> None:
    url = file_url(tmp_path / "fresh.db")
    fails(1, "db", "current", "--url", url)  # reading never creates the file
    assert not (tmp_path / "fresh.db").exists()
    assert "upgraded from none" in ok("db", "upgrade", "--url", url).stdout
    empty = file_url(tmp_path / "empty.db")
    (tmp_path / "empty.db").touch()
    _db_upgrade_current_check(empty)


@pytest.mark.postgres
def test_db_upgrade_on_an_empty_postgres(empty_postgres_url: str) -> None:
    _db_upgrade_current_check(empty_postgres_url)


def test_db_current_and_check_report_a_schema_behind(database_url: str) -> None:
    async def to_0001() -> None:
        engine = create_async_engine(database_url)
        try:
            await downgrade(engine, "0001")
        finally:
            await engine.dispose()

    run_in_thread(to_0001)
    assert "current: 0001  (behind" in ok("db", "current", "--url", database_url).stdout
    drift = fails(1, "db", "check", "--url", database_url).stdout
    assert f"drift: the database is at 0001, head is {SCHEMA_REVISION}" in drift
    # Every other command refuses, naming the fix.
    refused = fails(1, "runs", "--url", database_url)
    assert "revision 0001" in refused.stderr
    assert "run `jobrun db upgrade`" in refused.stderr
    ok("db", "upgrade", "--url", database_url)
    ok("runs", "--url", database_url)


def test_db_check_finds_a_table_that_differs(database_url: str) -> None:
    execute(database_url, text("ALTER TABLE _substrat_job_steps ADD COLUMN extra INTEGER"))
    result = fails(1, "db", "check", "--url", database_url)
    assert "drift: remove_column" in result.stdout
    assert "extra" in result.stdout


def test_db_check_ignores_a_hosts_tables(database_url: str) -> None:
    execute(database_url, text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    ok("db", "check", "--url", database_url)
