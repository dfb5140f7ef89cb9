"""The ``jobrun`` group and the parts its commands share, end to end on SQLite and Postgres:
one-line errors and exit codes, help, durations, the watch's rates and progress.

Most tests call the click group in-process (``CliRunner``); a few run the real
program (``python -m jobrun``) to prove the entry point, the environment
variable and the exit codes survive a process boundary. Each command group's
own tests are in ``test_cli_<module>.py``, after its module in
``jobrun/_cli/commands/``; their registry and helpers in ``cli_support.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import jobrun
from jobrun._cli.params import parse_duration
from jobrun._cli.watching import Poll, line, progress_of
from tests.processes.cli_support import fails, file_url, finish, invoke, ok
from tests.support import REPO, SQL_BACKENDS


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Only the SQL backends: the command line always speaks to a database."""
    return str(request.param)


# --- watch: rates and progress -------------------------------------------------------------


def test_rates_are_per_counter_per_second_between_polls() -> None:
    def record(**counters: int) -> jobrun.JobRun:
        epoch = datetime(2030, 1, 1, tzinfo=UTC)
        return jobrun.JobRun(
            id="r", module_id="m", job="j", instance="i", status="running", payload=None,
            cursor=None, counters=dict(counters), attempts=0, last_error=None,
            started_at=epoch, updated_at=epoch, next_attempt_at=None, ended_at=None,
        )  # fmt: skip

    first = Poll(record(objects=10), at=100.0)
    second = first.follow(record(objects=30, pages=2), at=102.0)
    assert second.rates == {"objects": 10.0, "pages": 1.0}
    assert "objects/s=10.0" in line(second)
    assert first.follow(record(objects=10), at=100.0).rates == {}  # no time passed


def test_progress_rule() -> None:
    assert progress_of({"objects": 5}) is None
    assert progress_of({"total": 0, "done": 1}) is None
    assert progress_of({"total": 10, "done": 2, "objects": 7, "pages": 9}) == ("done", 2, 10)
    assert progress_of({"total": 10, "objects": 7, "pages": 9}) == ("objects", 7, 10)
    assert progress_of({"total": 10, "pages": 9, "rows": 4}) == ("pages", 9, 10)
    assert progress_of({"total": 10}) is None


# --- errors and usage ----------------------------------------------------------------------


def test_unknown_run_ids_fail_with_one_line(database_url: str) -> None:
    for command in (["show"], ["resume"], ["release"], ["cancel", "--reason", "x"]):
        result = fails(1, *command, "--url", database_url, "nope")
        assert result.stderr.strip() == "Error: no job run has the id 'nope'"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "cannot parse the database URL"),
        ("mysql+aiomysql://u@h/db", "unsupported database"),
        ("sqlite+nodriver:///x.db", "unknown database driver"),
        ("postgresql+psycopg2://u@h/db", "not an asyncio driver"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:1/db", "cannot connect to the database"),
    ],
)
def test_bad_urls_fail_with_one_line(url: str, message: str) -> None:
    result = fails(1, "runs", "--url", url)
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "secret" not in result.stderr


def test_a_database_without_the_schema(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    result = fails(1, "runs", "--url", file_url(empty))
    assert "has no jobrun schema" in result.stderr
    assert "run `jobrun db upgrade`" in result.stderr
    missing = fails(1, "health", "--url", file_url(tmp_path / "missing.db"))
    assert "no SQLite database at" in missing.stderr


def test_plain_sqlite_url_and_the_environment_variable(sqlite_url: str) -> None:
    plain = sqlite_url.replace("sqlite+aiosqlite:", "sqlite:")
    result = invoke("start", "shop", "walk", env={"JOBRUN_DATABASE_URL": plain})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("started ")


def test_usage_errors_exit_2(sqlite_url: str) -> None:
    fails(2, "runs", env={"JOBRUN_DATABASE_URL": None})  # no URL at all
    fails(2, "runs", "--url", sqlite_url, "--status", "sleeping")
    fails(2, "runs", "--url", sqlite_url, "--limit", "0")
    fails(2, "prune", "--url", sqlite_url, "--older-than", "soon")
    fails(2, "prune", "--url", sqlite_url, "--older-than", "1d", "--status", "running")
    fails(2, "start", "--url", sqlite_url, "shop", "walk", "--payload", "{not json")
    fails(2, "start", "--url", sqlite_url, "", "walk")
    fails(2, "cancel", "--url", sqlite_url, "some-id")  # --reason is required
    fails(2, "watch", "--url", sqlite_url, "x", "--interval", "0")
    fails(2, "no-such-command")


def test_every_command_has_help_with_an_example() -> None:
    commands = [
        ["db", "upgrade"], ["db", "current"], ["db", "check"], ["runs"], ["show"], ["watch"],
        ["start"], ["cancel"], ["resume"], ["release"], ["prune"], ["health"],
    ]  # fmt: skip
    for command in commands:
        text_out = ok(*command, "--help").stdout
        assert "Example:" in text_out, command
        assert "JOBRUN_DATABASE_URL" in text_out, command


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("", "7", "d", "7 days", "-1d", "1d x"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


# --- as a real program ---------------------------------------------------------------------


def program(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JOBRUN_DATABASE_URL"}
    if url is not None:
        env["JOBRUN_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "jobrun", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_as_a_program(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Migrate, start, list and watch through the real entry point, URL from the environment."""
    if backend == "sqlite":
        url = file_url(tmp_path / "program.db")
    else:
        url = request.getfixturevalue("empty_postgres_url")
    upgraded = program("db", "upgrade", url=url)
    assert upgraded.returncode == 0, upgraded.stderr
    started = program("start", "shop", "walk", "--payload", "{}", url=url)
    assert started.returncode == 0, started.stderr
    verb, run_id = started.stdout.split()
    assert verb == "started"
    finish(url, run_id)
    listed = program("runs", "--json", url=url)
    assert listed.returncode == 0, listed.stderr
    assert [record["status"] for record in json.loads(listed.stdout)] == ["done"]
    watched = program("watch", run_id, "--interval", "0.05", url=url)
    assert watched.returncode == 0, watched.stderr
    assert "30 / 30 objects" in watched.stdout


def test_program_exit_codes(tmp_path: Path) -> None:
    bad = program("runs", url="nonsense://")
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: ")
    assert "Traceback" not in bad.stderr
    missing = program("show", "x", url=None)
    assert missing.returncode == 2
    assert "Missing option '--url'" in missing.stderr
    unknown = program("show", "nope", url=file_url(tmp_path / "none.db"))
    assert unknown.returncode == 1
    assert "jobrun db upgrade" in unknown.stderr
