"""The usage examples, run the way the documentation tells a reader to run them.

* ``examples/asgi_service.py``: the Starlette app with its lifespan, through
  Starlette's ``TestClient`` (which runs the lifespan), on SQLite and Postgres;
* ``examples/asyncio_loop.py``: a real process, to the end and stopped by SIGTERM;
* ``examples/provision.py``: fifty SQLite files through ``upgrade_many``, and a
  Postgres database (or a tenant schema) through plain Alembic;
* ``examples/walk_api_politely.py``: against the stand-in API (``tests/fake_api.py``) in
  this process, keeping to its rate, and deferred by its 429s;
* ``examples/test_invoice_job.py``, ``examples/test_fenced_writes.py``: jobs' own tests,
  run by pytest.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.testclient import TestClient

import jobrun
from jobrun.sql.upgrades.migrate import head_revision
from tests.fake_api import FakeApi, object_size, serve
from tests.support import REPO, SQL_BACKENDS, revision_of

EXAMPLES = REPO / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(
    name: str, *arguments: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


def read_runs(url: str, **filters: Any) -> list[jobrun.JobRun]:
    async def read() -> list[jobrun.JobRun]:
        engine = create_async_engine(url)
        try:
            return await jobrun.job_runs(jobrun.SqlJobRunStore(engine), limit=500, **filters)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def runs_so_far(url: str) -> list[jobrun.JobRun]:
    """The runs, or none while the program is still creating the database."""
    try:
        return read_runs(url)
    except (jobrun.SchemaOutdatedError, jobrun.StoreError):
        return []


# --- the ASGI service ---------------------------------------------------------------------


def wait_for_end(client: TestClient, run_id: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        if shown["status"] != "running":
            return shown
        # sleep: a poll interval; the deadline only bounds a hang
        time.sleep(0.05)
    pytest.fail(f"run {run_id} was still running after {timeout_s} s")


@pytest.mark.parametrize("blank_url", SQL_BACKENDS, indirect=True)
def test_the_service_starts_a_run_and_its_lifespan_drives_it(blank_url: str) -> None:
    service = load_example("asgi_service")
    app = service.create_app(blank_url, poll_interval_s=0.1)
    with TestClient(app) as client:
        started = client.post("/exports/ada")
        assert started.status_code == 202
        run_id = started.json()["run_id"]
        shown = wait_for_end(client, run_id)
        assert shown == {
            "run_id": run_id,
            "status": "done",
            "counters": {"orders": 100},
            "last_error": None,
        }
        assert client.get("/runs/NO-SUCH-RUN").status_code == 404
        refused = client.post("/exports/a%00b")
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["path"] == "instance"
        worker = app.state.worker
        assert not worker.done()
    # Shutdown stopped the worker by its stop event: it returned, it was not cancelled.
    assert worker.done()
    assert not worker.cancelled()
    assert worker.exception() is None
    assert [run.instance for run in read_runs(blank_url)] == ["ada"]


def test_shutting_down_mid_run_leaves_no_lease_behind(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
    service = load_example("asgi_service")
    app = service.create_app(url, poll_interval_s=0.05)
    with TestClient(app) as client:
        run_id = client.post("/exports/grace").json()["run_id"]
    (run,) = read_runs(url)
    assert run.id == run_id
    # Either the run finished before shutdown or its lease went back: another
    # process can carry on at once, without waiting for a lease to expire.
    assert run.lease_driver is None
    assert run.lease_expires_at is None
    assert run.status in ("running", "done")


# --- the asyncio program ------------------------------------------------------------------


def test_the_asyncio_program_drives_every_run_to_the_end(tmp_path: Path) -> None:
    db = tmp_path / "loop.db"
    done = run_example("asyncio_loop.py", "--db", str(db), "--runs", "3", "--idle", "0.05")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = read_runs(f"sqlite+aiosqlite:///{db}", module_id="example")
    assert sorted(run.instance for run in runs) == ["batch-0", "batch-1", "batch-2"]
    for run in runs:
        assert run.status == "done"
        assert run.counters["items"] == run.counters["total"] > 0
        assert f"run {run.id}: done" in done.stdout


def test_the_asyncio_program_stops_on_sigterm_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "loop.db"
    url = f"sqlite+aiosqlite:///{db}"
    command = [sys.executable, str(EXAMPLES / "asyncio_loop.py"), "--db", str(db), "--runs", "12"]
    program = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(run.cursor for run in runs_so_far(url)):
            assert program.poll() is None, "the program ended before any pass committed"
            assert time.monotonic() < deadline, "no pass committed within 60 s"
            # sleep: a poll interval; the deadline only bounds a hang
            time.sleep(0.05)
        program.send_signal(signal.SIGTERM)
        output, _ = program.communicate(timeout=60)
    finally:
        program.kill()
        program.wait()
    assert program.returncode == 1, output  # interrupted, not finished
    unfinished = [run for run in read_runs(url) if run.status == "running"]
    assert unfinished, "every run finished before the signal; nothing was interrupted"
    assert all(run.lease_driver is None for run in unfinished)

    again = run_example("asyncio_loop.py", "--db", str(db), "--runs", "12", "--idle", "0.05")
    assert again.returncode == 0, again.stdout + again.stderr
    finished = {run.id: run for run in read_runs(url)}
    for run in unfinished:
        # The same run carried on (joined, not started anew) ...
        assert f"run {run.id} ({run.instance}): running, cursor {run.cursor}" in again.stdout
        resumed = finished[run.id]
        assert resumed.status == "done"
        # ... and counted each page exactly once, however the signal split the work.
        assert resumed.counters["items"] == resumed.counters["total"]
    assert all(run.status == "done" for run in finished.values())


# --- provisioning -------------------------------------------------------------------------


def test_provisioning_fifty_sqlite_scope_databases(tmp_path: Path) -> None:
    scopes = tmp_path / "scopes"
    done = run_example("provision.py", "--sqlite-dir", str(scopes), "--count", "50")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "50 SQLite databases: 50 upgraded, 0 failed" in done.stdout
    assert "checked 50: every one is at jobrun's newest revision" in done.stdout
    files = sorted(scopes.glob("*.db"))
    assert len(files) == 50

    async def revisions() -> set[str | None]:
        found = set()
        for path in files:
            engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
            try:
                found.add(await revision_of(engine))
            finally:
                await engine.dispose()
        return found

    assert asyncio.run(revisions()) == {head_revision()}
    # Running it again is harmless: everything is already at head.
    again = run_example("provision.py", "--sqlite-dir", str(scopes), "--count", "50")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "50 SQLite databases: 0 upgraded, 0 failed" in again.stdout


@pytest.mark.postgres
@pytest.mark.parametrize("schema", [None, "tenant_a"])
def test_provisioning_postgres_with_alembic(empty_postgres_url: str, schema: str | None) -> None:
    extra = ["--schema", schema] if schema else []
    done = run_example("provision.py", "--postgres-url", empty_postgres_url, *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    # `alembic current`, run by the example after the upgrade, names the head.
    assert f"(schema {schema or 'default'}): {head_revision()} (head)" in done.stdout
    assert "checked 1: every one is at jobrun's newest revision" in done.stdout

    async def revision() -> str | None:
        engine = create_async_engine(empty_postgres_url)
        try:
            if schema is None:
                return await revision_of(engine)
            async with engine.connect() as connection:
                table = f"{schema}.jobrun_alembic_version"
                return (
                    await connection.exec_driver_sql(f"SELECT version_num FROM {table}")
                ).scalar()
        finally:
            await engine.dispose()

    assert asyncio.run(revision()) == head_revision()


# --- a job's own tests --------------------------------------------------------------------


def test_the_example_job_tests_pass() -> None:
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "examples/test_invoice_job.py",
            "examples/test_fenced_writes.py",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout


# --- the tutorial -------------------------------------------------------------------------


def _tutorial_kill_line() -> str:
    """The tutorial's own "kill it without warning" line, as a reader copies it."""
    text = (REPO / "docs" / "tutorial.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if "kill -9 $!" in line]
    return line


def test_the_tutorial_program_survives_kill_9(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'tutorial.db'}"
    environment = {**os.environ, "TUTORIAL_DATABASE_URL": url}
    command = [sys.executable, str(EXAMPLES / "tutorial.py")]
    # The documented line, run by a shell where the reader stands: it must kill the
    # program mid-walk however long the machine takes to get to page 2.
    line = _tutorial_kill_line().replace("python ", f"{sys.executable} ", 1)
    line = line.replace("examples/tutorial.py", str(EXAMPLES / "tutorial.py"))
    killed = subprocess.run(
        ["bash", "-c", line], cwd=tmp_path, env=environment, capture_output=True,
        text=True, timeout=90, check=False,
    )  # fmt: skip
    assert "page 2:" in killed.stdout, killed.stdout + killed.stderr
    assert "done, counters" not in killed.stdout  # killed mid-walk, not at its end
    (cut,) = read_runs(url)
    assert cut.status == "running"

    again = subprocess.run(
        command, capture_output=True, text=True, timeout=90, env=environment, check=False
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"run {cut.id}: running at page {cut.cursor}" in again.stdout
    (run,) = read_runs(url)
    assert run.id == cut.id
    assert run.status == "done"
    assert run.counters == {"total": 20, "pages": 20}  # each page counted once


# --- walking an external API politely ------------------------------------------------------


async def walk_example(url: str, api: str, *options: str) -> list[jobrun.JobRun]:
    example = load_example("walk_api_politely")
    arguments = ["--url", url, "--api", api, "--page", "10", "--drive", *options]
    runs: list[jobrun.JobRun] = await example.run(example.parse(arguments))
    return runs


async def test_the_polite_walk_keeps_to_the_rate_and_marks_each_object_once(
    sqlite_url: str,
) -> None:
    api = FakeApi(per_second=100, burst=5, latency_ms=5)
    async with await serve(api) as serving:
        runs = await walk_example(
            sqlite_url, serving.url, "--objects", "60", "--runs", "3", "--per-second", "100"
        )
    assert sorted(run.instance for run in runs) == ["shard-0", "shard-1", "shard-2"]
    assert all(run.status == "done" for run in runs), [run.last_error for run in runs]
    assert sum(run.counters["objects"] for run in runs) == 60
    assert sum(run.counters["bytes"] for run in runs) == sum(object_size(n) for n in range(60))
    assert api.refused == 0, "kept to the declared rate: the API refused nothing"
    assert api.fetches == Counter(range(60))
    assert api.writes == Counter(range(60))


async def test_a_429_defers_the_pass_and_the_walk_still_writes_each_object_once(
    sqlite_url: str,
) -> None:
    # The API allows far less than the rate declared: it refuses, and says when to come back.
    api = FakeApi(per_second=40, burst=5, latency_ms=5)
    async with await serve(api) as serving:
        runs = await walk_example(
            sqlite_url, serving.url, "--objects", "20", "--per-second", "1000", "--burst", "50"
        )
    [run] = runs
    assert run.status == "done", run.last_error
    assert run.counters["objects"] == 20
    assert api.refused > 0, "the API never refused: nothing was deferred"
    # Deferred passes replay their finished steps from the ledger and re-send the
    # marks with the same keys, so each object is fetched and written exactly once.
    assert api.fetches == Counter(range(20))
    assert api.writes == Counter(range(20))
