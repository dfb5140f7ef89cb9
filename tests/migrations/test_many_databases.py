"""``jobrun db upgrade|current|check`` on many databases, and ``jobrun.upgrade_many``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import jobrun
import jobrun._cli.commands.db  # registers the db commands on the group
from jobrun._cli.app import cli
from jobrun._cli.many_databases import urls_in
from jobrun.sql.schema import SCHEMA_REVISION
from tests.support import run_in_thread


def invoke(*args: str) -> Result:
    return CliRunner().invoke(
        cli, list(args), env={"JOBRUN_DATABASE_URL": None}, catch_exceptions=False
    )


def unreachable(tmp_path: Path) -> str:
    # A file in a directory that does not exist: SQLite cannot open it.
    return f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}"


def test_upgrade_many_files_keeps_going_past_a_failure_and_exits_1(tmp_path: Path) -> None:
    good = [f"sqlite:///{tmp_path / f'tenant-{n}.db'}" for n in range(5)]
    listed = tmp_path / "urls.txt"
    listed.write_text("# tenants\n" + "\n".join(good[2:]) + "\n\n")
    bad = unreachable(tmp_path)
    result = invoke(
        "db", "upgrade", "--url", good[0], "--url", bad, "--url", good[1],
        "--urls-file", str(listed), "--concurrency", "2",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 7, result.output  # one per database and the summary
    assert lines[1].startswith(f"sqlite+aiosqlite:///{tmp_path}/missing-dir/x.db: FAILED:")
    assert lines[0].endswith(f"upgraded from none (no jobrun schema) to {SCHEMA_REVISION} (head)")
    assert lines[-1] == "6 databases: 1 failed, 5 upgraded"
    for url in good:
        assert Path(url.removeprefix("sqlite:///")).exists()

    again = invoke("db", "upgrade", "--urls-file", str(listed), "--url", good[0])
    assert again.exit_code == 0, again.output
    assert again.output.splitlines()[-1] == "4 databases: 4 already at head"
    current = invoke("db", "current", "--urls-file", str(listed), "--url", bad)
    assert current.exit_code == 1, current.output
    assert current.output.splitlines()[-1] == "4 databases: 3 at head, 1 failed"
    check = invoke("db", "check", "--urls-file", str(listed), "--url", good[0])
    assert check.exit_code == 0, check.output
    assert check.output.splitlines()[-1] == "4 databases: 4 ok"


def test_current_and_check_on_many_do_not_create_missing_files(tmp_path: Path) -> None:
    made = f"sqlite:///{tmp_path / 'made.db'}"
    assert invoke("db", "upgrade", "--url", made).exit_code == 0
    absent = tmp_path / "absent.db"
    for command in ("current", "check"):
        result = invoke("db", command, "--url", made, "--url", f"sqlite:///{absent}")
        assert result.exit_code == 1, result.output
        assert f"no SQLite database at {absent}" in result.output
        assert not absent.exists()


def test_no_database_is_a_usage_error() -> None:
    result = invoke("db", "upgrade")
    assert result.exit_code == 2
    assert "--url" in result.output


@pytest.mark.postgres
def test_upgrade_many_as_a_function_mixes_dialects_and_reports_in_order(
    tmp_path: Path, empty_postgres_url: str
) -> None:
    urls = [
        f"sqlite:///{tmp_path / 'a.db'}",
        empty_postgres_url.replace("+asyncpg", ""),
        "postgresql://postgres@127.0.0.1:5432/jobrun_no_such_database",
        f"sqlite:///{tmp_path / 'b.db'}",
    ]
    results = run_in_thread(lambda: jobrun.upgrade_many(urls, concurrency=3))
    assert [result.failed for result in results] == [False, False, True, False]
    assert [result.after for result in results] == [SCHEMA_REVISION] * 2 + [None, SCHEMA_REVISION]
    assert all(result.changed for result in results if not result.failed)
    assert "jobrun_no_such_database" in results[2].url
    assert results[2].error is not None
    assert "does not exist" in results[2].error
    again = run_in_thread(lambda: jobrun.upgrade_many(urls[:2]))
    assert [(result.before, result.changed) for result in again] == [(SCHEMA_REVISION, False)] * 2


def test_upgrade_many_refuses_a_bad_concurrency() -> None:
    with pytest.raises(jobrun.JobValidationError, match="concurrency"):
        run_in_thread(lambda: jobrun.upgrade_many(["sqlite://"], concurrency=0))


def test_a_urls_file_skips_blank_lines_and_comments() -> None:
    lines = ["# tenants\n", "\n", "  sqlite:///a.db  \n", "#sqlite:///b.db\n", "postgresql://x/y"]
    assert urls_in(lines) == ["sqlite:///a.db", "postgresql://x/y"]
