"""``jobrun worker --loop``: the worker drives runs and stops on SIGTERM on asyncio's own
loop and, where the ``speed`` extra is installed, on uvloop (CI installs it, so
every other worker test there runs on uvloop, ``--loop auto``'s choice)."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import time

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.support import spawn_worker

APP = "tests.processes.worker_app:registry"
LOOPS = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("uvloop") is None,
            reason="uvloop is not installed (the speed extra)",
        ),
    ),
]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_the_worker_drives_runs_and_stops_on_either_loop(
    database_url: str, loop: str
) -> None:
    engine = create_async_engine(database_url)
    store = jobrun.SqlJobRunStore(engine)
    try:
        run = await jobrun.start_job_run(store, module_id="demo", job="pages", payload={"pages": 3})
        process = spawn_worker(APP, "--url", database_url, "--interval", "0.2", "--loop", loop)
        try:
            deadline = time.monotonic() + 20
            while (await jobrun.get_job_run(store, run.id)).status != "done":
                assert time.monotonic() < deadline, "the run was not done within 20 s"
                # sleep: a poll interval; the deadline only bounds a hang
                await asyncio.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            _, errors = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, errors
        assert "worker stopped" in errors
        assert f"event loop: {loop}" in errors
        record = await jobrun.get_job_run(store, run.id)
        assert record.counters == {"pages": 3}
    finally:
        await engine.dispose()
