"""Workers of a pinned earlier commit against a database this code migrated
(docs/how-to/upgrade.md, "Which versions may run side by side").

The earlier jobrun is taken out of the repository's history with ``git archive``
into a temporary directory and run by a child process whose ``PYTHONPATH`` names
only that tree; the database is migrated by this code.

* A mix declared safe: code of revision 0004 (the "never twice" fencing) against
  a database at 0005, which declared code of 0004 safe, drives a run to done; the
  database then goes on to the head and this code reads the run.
* A mix declared unsafe, shown: code of revision 0005 against a database at 0006.
  It predates the compatibility record, so nothing stops it: it claims a run that
  version-2 code committed and hands its cursor to its own handler. That is why
  such workers are stopped before the migration; code from 0006 on refuses (see
  tests/migrations/test_migration_0006_versions.py).

Skipped where the history is not at hand (an sdist, a shallow clone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from tests.support import REPO

# The merge of revision 0004 (fencing epochs: "never twice"), and the last commit
# before revision 0006 (main's head when versioned jobs were written).
REVISION_0004_COMMIT = "25fcd64"
REVISION_0005_COMMIT = "f0938e1"

CHILD = """
import asyncio, json, sys

import jobrun
from jobrun.sql.schema import SCHEMA_REVISION
from sqlalchemy.ext.asyncio import create_async_engine

seen = []


async def handler(p):
    seen.append(p.cursor)
    page = await p.step("page", lambda: (p.cursor or {}).get("n", 0) + 1)
    return jobrun.PassResult(cursor={"n": page}, done=page >= 3)


async def main(url, start):
    engine = create_async_engine(url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        registry = jobrun.JobRegistry()
        registry.register("pinned", "count", handler)
        if start:
            await jobrun.start_job_run(store, module_id="pinned", job="count")
        report = await jobrun.run_due_jobs(store, registry, max_passes=10)
        runs = await jobrun.job_runs(store, module_id="pinned", job="count")
        print(json.dumps({
            "revision": SCHEMA_REVISION,
            "package": jobrun.__file__,
            "completed": report.completed,
            "seen": seen,
            "runs": [[run.status, run.cursor] for run in runs],
        }))
    finally:
        await engine.dispose()


asyncio.run(main(sys.argv[1], sys.argv[2] == "start"))
"""


def _checkout(commit: str, into: Path) -> Path:
    """The ``jobrun`` package of ``commit``, extracted under ``into``."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "jobrun"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout's history")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def _run_child(tree: Path, url: str, start: bool) -> dict[str, Any]:
    script = tree / "pinned_child.py"
    script.write_text(CHILD)
    # Only the pinned tree: it comes before site-packages (and the editable install).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, str(script), url, "start" if start else "drive"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["package"]).is_relative_to(tree), result
    return result


async def _engine(path: Path) -> AsyncEngine:
    return create_async_engine(f"sqlite+aiosqlite:///{path}")


async def test_a_revision_0004_worker_drives_runs_on_a_database_at_0005(tmp_path: Path) -> None:
    tree = _checkout(REVISION_0004_COMMIT, tmp_path / "pinned")
    database = tmp_path / "jobs.db"
    engine = await _engine(database)
    try:
        await jobrun.upgrade(engine, "0005")
        result = _run_child(tree, f"sqlite+aiosqlite:///{database}", start=True)
        assert result["revision"] == "0004"
        assert (result["completed"], result["runs"]) == (1, [["done", {"n": 3}]])
        assert result["seen"] == [None, {"n": 1}, {"n": 2}]
        # On to the head: this code reads the run the older worker finished (version 1).
        await jobrun.upgrade(engine)
        (run,) = await jobrun.job_runs(jobrun.SqlJobRunStore(engine), module_id="pinned")
        assert (run.status, run.cursor, run.passes_committed, run.job_version) == (
            "done",
            {"n": 3},
            3,
            1,
        )
    finally:
        await engine.dispose()


async def test_code_from_before_0006_runs_newer_versions_runs_so_it_must_be_stopped_first(
    tmp_path: Path,
) -> None:
    tree = _checkout(REVISION_0005_COMMIT, tmp_path / "pinned")
    database = tmp_path / "jobs.db"
    engine = await _engine(database)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        run = await jobrun.start_job_run(store, module_id="pinned", job="count")
        # Committed by version-2 code of the job: a cursor the old handler cannot know.
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "UPDATE _substrat_job_runs SET job_version = 2, "
                    """cursor = '{"n": 1, "shard": "b"}' WHERE id = :id"""
                ),
                {"id": run.id},
            )
        result = _run_child(tree, f"sqlite+aiosqlite:///{database}", start=False)
        assert result["revision"] == "0005"
        # Not refused: it took the version-2 run and fed its cursor to its own handler.
        assert result["seen"][0] == {"n": 1, "shard": "b"}
        assert result["runs"][0][0] == "done"
    finally:
        await engine.dispose()
