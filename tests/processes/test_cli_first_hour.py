"""The command line under hostile input, at 80 and 120 columns, and with jobs nobody runs.

Hostile input gets one line and an exit status, never a traceback. ``jobrun runs``
is readable in a narrow terminal. Due runs of a job that no worker registers are
visible in ``jobrun health`` and in a worker's log. SQLite and Postgres.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import Result
from rich.console import Console
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
import jobrun._cli.commands.actions  # registers the commands on the group
import jobrun._cli.commands.health
import jobrun._cli.commands.runs
import jobrun._cli.commands.worker
from jobrun._cli.app import LAZY_COMMANDS, cli
from jobrun._cli.render import runs_table
from tests.processes.cli_support import CLI_APP, invoke, start, with_store
from tests.support import REPO, SQL_BACKENDS, log_worker_statements


@pytest.fixture(params=SQL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def one_line_failure(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1, result.output
    return error_lines[0]


# --- hostile input ------------------------------------------------------------------------


def test_a_50000_deep_payload_gets_one_line(database_url: str) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    line = one_line_failure(
        invoke("start", "--url", database_url, "shop", "walk", "--payload", deep), 2
    )
    assert "nested too deeply" in line
    assert json.loads(invoke("runs", "--url", database_url, "--json").stdout) == []


def test_a_payload_nested_past_the_limit_is_refused_by_jobrun(database_url: str) -> None:
    deep = "[" * 300 + "]" * 300  # decodes, but deeper than jobrun carries
    line = one_line_failure(
        invoke("start", "--url", database_url, "shop", "walk", "--payload", deep), 2
    )
    assert "nested more than 256 levels deep" in line


def test_prune_older_than_millions_of_days(database_url: str) -> None:
    result = invoke("prune", "--url", database_url, "--older-than", "3000000d")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "pruned 0 runs"
    line = one_line_failure(
        invoke("prune", "--url", database_url, "--older-than", "99999999999999d"), 2
    )
    assert "longer than any duration Python can hold" in line


@pytest.mark.parametrize(
    "arguments",
    [
        ["start", "shop", "bad\udcffjob"],
        ["start", "shop", "walk", "--instance", "\udcff"],
        ["runs", "--module", "\udcff"],
        ["cancel", "RUN", "--reason", "\udcff"],
    ],
    ids=["job", "instance", "filter", "reason"],
)
def test_text_that_is_not_unicode_gets_one_line_from_the_library(
    database_url: str, arguments: list[str]
) -> None:
    # What Python makes of non-UTF-8 argv (surrogateescape), passed straight to click.
    line = one_line_failure(invoke(*arguments[:1], "--url", database_url, *arguments[1:]), 2)
    assert "is not valid Unicode: a lone surrogate" in line


def test_non_utf8_arguments_to_the_program_get_one_line(sqlite_url: str) -> None:
    env = {**os.environ, "JOBRUN_DATABASE_URL": sqlite_url}
    not_utf8 = b"walk\xff".decode(errors="surrogateescape")
    done = subprocess.run(
        [sys.executable, "-m", "jobrun", "start", "shop", not_utf8],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == "Error: argument 'walk\\xff' is not valid UTF-8 text\n"


def test_the_worker_reads_the_url_from_the_environment(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    env = {"JOBRUN_DATABASE_URL": f"sqlite+aiosqlite:///{missing}"}
    line = one_line_failure(invoke("worker", "--app", CLI_APP, env=env), 1)
    # It got past "Missing option '--url'": the URL came from the environment.
    assert line == (
        f"Error: no SQLite database at {missing}: create it with "
        f"`jobrun db upgrade --url sqlite+aiosqlite:///{missing}`"
    )


def test_a_relative_sqlite_path_says_from_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite:///tmp/x.db (three slashes) is tmp/x.db under the current directory: the
    # hint says so, and how to write the absolute path that was probably meant.
    monkeypatch.chdir(tmp_path)
    line = one_line_failure(invoke("runs", "--url", "sqlite:///tmp/x.db"), 1)
    assert line.startswith(f"Error: no SQLite database at tmp/x.db, a path relative to {tmp_path}")
    assert "sqlite:////tmp/x.db" in line
    assert "`jobrun db upgrade --url sqlite:///tmp/x.db`" in line
    assert not (tmp_path / "tmp").exists()  # reading created nothing


# --- jobrun runs at 80 and 120 columns --------------------------------------------------------


def _runs() -> list[jobrun.JobRun]:
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def run(number: int, key: tuple[str, str, str], error: str | None) -> jobrun.JobRun:
        return jobrun.JobRun(
            id=f"01J0Z5K8QW3V2N8XG7S0R4M6T{number}", module_id=key[0], job=key[1],
            instance=key[2], status="failed" if error else "running", payload=None,
            cursor={"page": 12}, counters={"objects": 1200, "total": 5000}, attempts=3,
            last_error=error, started_at=at - timedelta(hours=2), updated_at=at,
            next_attempt_at=None, ended_at=None,
        )  # fmt: skip

    return [
        run(1, ("shop", "reindex", "shop-42"), None),
        run(2, ("shop", "reindex", "shop-43"), "step 'fetch-page-3' failed: TimeoutError: slow"),
        run(3, ("billing-service", "monthly-invoices", "customer-0000123456"), None),
    ]


@pytest.mark.parametrize("width", [80, 120])
def test_runs_fits_the_terminal_one_line_per_run(width: int) -> None:
    console = Console(width=width, record=True, color_system=None)
    console.print(runs_table(_runs(), datetime(2026, 1, 1, tzinfo=UTC), width))
    lines = console.export_text().splitlines()
    # A header, its rule, and exactly one line per run: nothing wraps.
    assert len(lines) == 2 + 3, lines
    assert all(len(line) <= width for line in lines)
    header = lines[0].split()
    assert header[:4] == ["id", "key", "status", "last"]
    for line, number in zip(lines[2:], (1, 2, 3), strict=True):
        # The whole id (to paste into `jobrun show`) and a readable key.
        assert line.startswith(f"01J0Z5K8QW3V2N8XG7S0R4M6T{number}   ")
    assert "shop/reindex/shop-42" in lines[2]
    assert "step 'fetch" in lines[3]
    if width == 120:
        assert "attempts" in lines[0]
        assert "objects=1,200" in lines[2]


# --- jobs nobody registers ----------------------------------------------------------------------


def test_health_shows_due_runs_per_job_and_marks_the_unregistered(database_url: str) -> None:
    start(database_url, instance="a")
    start(database_url, instance="b")
    with_store(
        database_url,
        lambda store: jobrun.start_job_run(store, module_id="shop", job="forgotten"),
    )
    counts = json.loads(invoke("health", "--url", database_url, "--json").stdout)
    assert counts["due"] == 3
    assert counts["due_by_job"] == [
        {"module_id": "shop", "job": "forgotten", "due": 1, "live_workers": 0},
        {"module_id": "shop", "job": "walk", "due": 2, "live_workers": 0},
    ]
    marked = invoke("health", "--url", database_url, "--app", CLI_APP)
    assert marked.exit_code == 0, marked.output
    assert "due shop/forgotten  1  (not registered by --app: nothing will run these)" in (
        marked.output
    )
    [walk_line] = [line for line in marked.output.splitlines() if "due shop/walk" in line]
    # Registered by --app, but no live worker runs it either (none is running).
    assert " ".join(walk_line.split()) == "due shop/walk 2 (no live worker runs this job)"
    as_json = invoke("health", "--url", database_url, "--app", CLI_APP, "--json")
    assert [job["registered"] for job in json.loads(as_json.stdout)["due_by_job"]] == [
        False,
        True,
    ]


async def test_the_worker_warns_once_per_check_about_jobs_it_does_not_register(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_async_engine(database_url)
    log = log_worker_statements(monkeypatch)
    store = jobrun.SqlJobRunStore(engine)
    await jobrun.start_job_run(store, module_id="shop", job="forgotten")
    await jobrun.start_job_run(store, module_id="shop", job="forgotten", instance="2")
    caplog.set_level(logging.WARNING, logger="jobrun.worker")
    registry = jobrun.JobRegistry()
    registry.register("shop", "walk", lambda p: jobrun.PassResult(done=True))
    stop = asyncio.Event()
    worker = asyncio.ensure_future(
        jobrun.run_worker([engine], registry, interval_s=0.05, stop=stop)
    )
    try:
        # Many idle polls (claims) pass; the warning is not repeated per poll. (An idle
        # claim is one read: the core's conditional write follows only a candidate.)
        while sum(operation == "claim" for operation, _, _ in log.seen) < 10:  # noqa: ASYNC110 (the claims are counted by a hook)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await worker
        await engine.dispose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"2 due run(s) of job 'forgotten' of module 'shop' on "
        f"{engine.url.render_as_string(hide_password=True)} wait for a driver: this worker "
        "does not register that job (register it, or cancel the runs)"
    ]


# --- import cost ---------------------------------------------------------------------------------


def test_neither_import_jobrun_nor_a_command_that_does_not_migrate_imports_alembic(
    sqlite_url: str,
) -> None:
    # Alembic costs about what SQLAlchemy costs to import; only migrating needs it. SQLAlchemy
    # itself loads only for the commands that open a database, not for `import jobrun` or --help.
    # (The timings themselves are in benchmarks/scenarios/imports.py, not in a test.)
    heavy = "sorted({name.split('.')[0] for name in sys.modules} & {'alembic', 'sqlalchemy'})"
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['jobrun', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_module('jobrun', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print({heavy}, file=sys.stderr)\n"
    )
    expected = {
        (): "[]",
        ("--help",): "[]",
        ("worker", "--help"): "['sqlalchemy']",
        ("runs", "--url", sqlite_url): "['sqlalchemy']",
        ("health", "--url", sqlite_url): "['sqlalchemy']",
    }
    for arguments, loaded in expected.items():
        command = [sys.executable, "-c", probe, *arguments]
        if not arguments:
            command = [sys.executable, "-c", f"import sys, jobrun; print({heavy}, file=sys.stderr)"]
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, timeout=60, check=False
        )
        assert done.stderr.strip().splitlines()[-1] == loaded, (arguments, done.stderr)


def test_the_table_of_lazy_commands_matches_the_commands() -> None:
    for module in {module for module, _ in LAZY_COMMANDS.values()}:
        importlib.import_module(module)
    table = {
        name: (command.callback.__module__, " ".join((command.help or "").split("\n\n")[0].split()))
        for name, command in cli.commands.items()
        if command.callback is not None
    }
    assert table == LAZY_COMMANDS


@pytest.mark.parametrize("width", [40, 80, 200])
def test_help_lists_the_commands_as_click_would_from_the_commands_themselves(width: int) -> None:
    for module in {module for module, _ in LAZY_COMMANDS.values()}:
        importlib.import_module(module)
    context = click.Context(cli, terminal_width=width)
    from_table, from_commands = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
    cli.format_commands(context, from_table)
    click.Group.format_commands(cli, context, from_commands)
    assert from_table.getvalue() == from_commands.getvalue()
    assert "worker " in from_table.getvalue()


def test_a_payload_with_a_lone_surrogate_gets_one_line(database_url: str) -> None:
    line = one_line_failure(
        invoke("start", "--url", database_url, "shop", "walk", "--payload", '{"k": "\\ud800"}'), 2
    )
    assert "text with a lone surrogate (not valid Unicode)" in line


# --- the first hour: mistakes that used to print a traceback (issue 33, item 8) ------------


def _jobrun(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real ``jobrun`` command in a child process, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", "jobrun", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_a_syntax_error_in_the_app_module_gets_one_line_with_its_place(
    sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "broken_app.py").write_text("import jobrun\nregistry = (\n")
    done = _jobrun(
        "worker", "--app", "broken_app:registry", "--url", sqlite_url,
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1, done.stderr
    assert "broken_app.py:2" in error_lines[0]


def test_the_console_on_a_port_in_use_says_so_in_one_line_before_any_url(
    sqlite_url: str, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _jobrun("ui", "--url", sqlite_url, "--port", str(port), cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "http://" not in done.stdout + done.stderr


def test_the_console_without_the_ui_extra_gets_one_line_naming_the_extra(
    sqlite_url: str, tmp_path: Path
) -> None:
    # A path entry that shadows the extra's packages with ones that cannot be
    # imported: the environment of a user who installed jobrun without [ui].
    blocked = tmp_path / "blocked"
    for name in ("uvicorn", "starlette", "jinja2"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f'raise ImportError("No module named {name}")\n'
        )
    done = _jobrun("ui", "--url", sqlite_url, cwd=tmp_path, env={"PYTHONPATH": str(blocked)})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "pip install 'jobrun[ui]'" in lines[0]
