"""The walk demo as a user runs it: a real process, killed for real.

Each test drives ``examples/walk_demo.py`` in a subprocess against its own
SQLite file and reads the run back through jobrun's operator API.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.support import REPO

DEMO = REPO / "examples" / "walk_demo.py"
RUN_ID = r"[0-9A-HJKMNP-TV-Z]{26}"


def demo(db: Path, *options: str) -> list[str]:
    return [sys.executable, str(DEMO), "--db", str(db), *options]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def finish(db: Path, command: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=environment(), check=False
    )


def spawn(db: Path, command: list[str], output: IO[str]) -> subprocess.Popen[str]:
    # Output to a file, not a pipe: nobody reads a pipe while we wait, and a
    # full pipe would stall the demo.
    return subprocess.Popen(
        command, stdout=output, stderr=subprocess.STDOUT, text=True, env=environment()
    )


def read_runs(db: Path) -> list[jobrun.JobRun]:
    """The demo's runs in ``db``, newest first; none while the file is not set up yet."""
    if not db.exists():
        return []

    async def read() -> list[jobrun.JobRun]:
        engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
        try:
            store = jobrun.SqlJobRunStore(engine)
            return await jobrun.job_runs(store, module_id="demo", job="walk-objects")
        except (jobrun.SchemaOutdatedError, jobrun.StoreError):
            return []  # the demo has not finished upgrading the file yet
        finally:
            await engine.dispose()

    return asyncio.run(read())


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        # sleep: a poll interval; the deadline only bounds a hang
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting until {what}")


def the_run(db: Path) -> jobrun.JobRun:
    runs = read_runs(db)
    assert len(runs) == 1, f"expected exactly one run, found {[r.id for r in runs]}"
    return runs[0]


def assert_walked_exactly(run: jobrun.JobRun, objects: int) -> None:
    assert run.status == "done", run.last_error
    assert run.counters["objects"] == objects
    assert run.counters["total"] == objects


def committed_passes(output: str) -> int:
    found = re.search(r"^this copy committed (\d+) passes", output, re.MULTILINE)
    assert found, output
    return int(found[1])


def test_demo_walks_every_object_once(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = finish(db, demo(db, "--objects", "3000", "--page-size", "100"))
    assert done.returncode == 0, done.stdout + done.stderr
    started = re.search(rf"^started run ({RUN_ID})", done.stdout, re.MULTILINE)
    assert started, done.stdout
    assert f"run {started[1]}: done" in done.stdout
    assert "bytes match the source: OK" in done.stdout
    assert "slow it down: --latency-ms 200" in done.stdout  # not given: suggested
    # 30 pages, 4 a pass: 8 passes, each committed once.
    assert committed_passes(done.stdout) == 8
    run = the_run(db)
    assert run.id == started[1]
    assert_walked_exactly(run, 3000)
    # The command it prints to follow the run works as printed.
    watch = re.search(r"^follow it with: (.+)$", done.stdout, re.MULTILINE)
    assert watch, done.stdout
    assert f" watch {run.id} --url sqlite:///{db}" in watch[1]
    watched = subprocess.run(
        shlex.split(watch[1]), capture_output=True, text=True, timeout=60, check=False
    )
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert f"run {run.id} is done" in watched.stdout


def test_demo_progress_lines_fall_on_their_marks(tmp_path: Path) -> None:
    # A pass walks 2,000 objects (4 pages of 500) and fails often here: the progress
    # line comes at the pass that reaches each 10,000, never a pass or more later.
    db = tmp_path / "demo.db"
    options = ("--objects", "30000", "--failure-rate", "0.2", "--latency-ms", "0")
    done = finish(db, demo(db, *options), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    walked = re.findall(r"^\s*([\d,]+) objects walked", done.stdout, re.MULTILINE)
    assert walked == ["10,000", "20,000", "30,000"], done.stdout
    assert "--latency-ms 200" not in done.stdout  # given: not suggested again


def test_killed_demo_resumes_the_same_run(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    # 400 pages of 0-10 ms each: seconds of work, so the kill lands mid-walk.
    command = demo(db, "--objects", "40000", "--page-size", "100", "--latency-ms", "10")
    with (tmp_path / "first.log").open("w+") as log:
        first = spawn(db, command, log)
        try:
            run = wait_until(
                lambda: next((r for r in read_runs(db) if r.counters.get("objects", 0) > 0), None),
                "the first pass is committed",
            )
            assert first.poll() is None, "the demo finished before it could be killed"
            first.send_signal(signal.SIGKILL)
        finally:
            first.kill()
            first.wait()
        assert first.returncode == -signal.SIGKILL
        log.seek(0)
        assert f"started run {run.id}" in log.read()

    cut = the_run(db)
    assert cut.status == "running"
    assert 0 < cut.counters["objects"] < 40000

    resumed = finish(db, command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    match = re.search(rf"^resuming run ({RUN_ID}) at page (\d+) of 400", resumed.stdout, re.M)
    assert match, resumed.stdout
    assert match[1] == run.id
    # It resumes from the committed cursor: nothing before it is walked again,
    # and each pass after it is committed once (4 pages a pass).
    assert int(match[2]) == cut.cursor > 0
    assert committed_passes(resumed.stdout) == (400 - cut.cursor) // 4
    run = the_run(db)
    assert run.id == cut.id
    # Exactly N: no object counted twice, however the kill split a pass.
    assert_walked_exactly(run, 40000)
    assert "bytes match the source: OK" in resumed.stdout


def test_second_copy_joins_the_live_run(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    # 0-40 ms a page: the first copy is still walking when the second one starts.
    command = demo(db, "--objects", "40000", "--page-size", "100", "--latency-ms", "40")
    with (tmp_path / "first.log").open("w+") as log:
        first = spawn(db, command, log)
        try:
            live = wait_until(
                lambda: next((r for r in read_runs(db) if r.status == "running"), None),
                "the first copy's run is live",
            )
            second = finish(db, command)
            first.wait(timeout=60)
        finally:
            first.kill()
            first.wait()
        log.seek(0)
        first_output = log.read()

    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(rf"^resuming run {live.id} at page", second.stdout, re.M), second.stdout
    # Both copies report the same finished run, exact.
    assert f"run {live.id}: done" in second.stdout
    assert first.returncode == 0, first_output
    assert f"started run {live.id}" in first_output
    assert f"run {live.id}: done" in first_output
    assert_walked_exactly(the_run(db), 40000)
    # They shared the driving, and no pass was committed twice: 400 pages, 4 a pass.
    first_passes, second_passes = committed_passes(first_output), committed_passes(second.stdout)
    assert first_passes > 0, second.stdout
    assert second_passes > 0, first_output
    assert first_passes + second_passes == 100
