"""Workers that can be seen (issue 33 item 7), with a real ``jobrun worker`` process on
SQLite and Postgres: its row appears while it is idle, the console's Workers page,
``jobrun health`` and the runs list show it and flag a due run of a job it does not
register, SIGTERM deletes the row, and after ``kill -9`` the row goes stale by itself
(then a later worker's heartbeat deletes it)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.worker_rows import WorkerRow
from jobrun.ui import create_app
from tests.support import JOBRUN, REPO, spawn_worker

pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
APP = "tests.processes.worker_app:registry"
BEAT_S = "0.3"  # gone after three: 0.9 s without a heartbeat
HOSTS = ["console.test"]


async def _until(check: Callable[[], Awaitable[Any]], timeout_s: float = 30) -> Any:
    """``check()``'s first true value; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)
    return found


def _now_at() -> str:
    return format_instant(datetime.now(UTC))


async def _live(store: jobrun.SqlJobRunStore, pid: int) -> WorkerRow | None:
    return next((row for row in await store.live_workers(_now_at()) if row.pid == pid), None)


async def _stored_pids(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as connection:
        found = await connection.execute(text("SELECT pid FROM _substrat_job_workers"))
        return [int(pid) for (pid,) in found]


def _spawn(url: str) -> subprocess.Popen[str]:
    return spawn_worker(APP, "--url", url, "--interval", "0.5", "--register-every", BEAT_S)


def _stop(process: subprocess.Popen[str], how: signal.Signals) -> str:
    process.send_signal(how)
    _, stderr = process.communicate(timeout=30)
    return stderr


async def _cli(*args: str) -> str:
    done = await asyncio.to_thread(
        subprocess.run, [str(JOBRUN), *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
async def processes() -> AsyncIterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


async def test_an_idle_worker_is_seen_and_the_runs_it_will_not_take_are_flagged(
    database_url: str, engine: AsyncEngine, processes: list[subprocess.Popen[str]]
) -> None:
    store = jobrun.SqlJobRunStore(engine)
    # A typo'd job: nothing registers demo/pagez; and a run of demo/slow it does take.
    typo = await jobrun.start_job_run(store, module_id="demo", job="pagez", payload={"pages": 1})
    processes.append(worker := _spawn(database_url))
    row = await _until(lambda: _live(store, worker.pid))
    assert ["demo", "pages"] in [list(job) for job in row.job_pairs]
    assert ("demo", "pagez") not in row.job_pairs

    app = create_app({"main": store}, allowed_hosts=HOSTS)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://console.test"
    ) as client:
        page = (await client.get("/db/0/workers")).text
        runs = (await client.get("/db/0/runs")).text
    # Idle (it holds no lease), yet listed: its pid, "idle", its jobs.
    assert re.search(
        rf'<td class="num">{worker.pid}</td>\s*<td class="num"><span class="muted">idle', page
    )
    assert "demo / pagez</a>: 1 due" in page
    assert runs.count("no live worker runs this job</span>") == 1
    assert typo.id in runs

    health = json.loads(await _cli("health", "--url", database_url, "--json"))
    assert worker.pid in [found["pid"] for found in health["workers"]]
    [entry] = [e for e in health["due_by_job"] if e["job"] == "pagez"]
    assert entry["live_workers"] == 0
    table = await _cli("health", "--url", database_url)
    assert "due demo/pagez" in table
    assert "(no live worker runs this job)" in table
    assert f"pid {worker.pid}" in table
    listed = json.loads(await _cli("runs", "--url", database_url, "--json"))
    assert [run["no_live_worker"] for run in listed] == [True]
    assert "! demo/pagez: no live worker runs this job" in await _cli("runs", "--url", database_url)

    # SIGTERM: the worker deletes its row as it stops.
    stderr = await asyncio.to_thread(_stop, worker, signal.SIGTERM)
    assert worker.returncode == 0, stderr
    assert worker.pid not in await _stored_pids(engine)


async def test_a_killed_worker_goes_stale_and_a_later_heartbeat_deletes_it(
    database_url: str, engine: AsyncEngine, processes: list[subprocess.Popen[str]]
) -> None:
    store = jobrun.SqlJobRunStore(engine)
    processes.append(killed := _spawn(database_url))
    await _until(lambda: _live(store, killed.pid))
    await asyncio.to_thread(_stop, killed, signal.SIGKILL)
    # Its row stays, and stops counting once three heartbeats are missed.
    assert killed.pid in await _stored_pids(engine)
    await _until(lambda: _not(_live(store, killed.pid)))
    health = json.loads(await _cli("health", "--url", database_url, "--json"))
    assert killed.pid not in [found["pid"] for found in health["workers"]]
    # The next worker's first heartbeat deletes it.
    processes.append(later := _spawn(database_url))
    await _until(lambda: _live(store, later.pid))
    await _until(lambda: _without(engine, killed.pid))
    await asyncio.to_thread(_stop, later, signal.SIGTERM)


async def _not(found: Awaitable[Any]) -> bool:
    return not await found


async def _without(engine: AsyncEngine, pid: int) -> bool:
    return pid not in await _stored_pids(engine)
