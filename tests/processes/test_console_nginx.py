"""The console behind a real nginx, configured by the block the how-to gives, as written.

The ``location`` block is read out of ``docs/how-to/operate.md`` (only the
upstream's port is replaced by the port ``jobrun ui`` got), nginx listens on a
port that is not the scheme's default, and a run is cancelled through it the way
a browser does: the page, its CSRF cookie and token, then the POST with the
``Origin`` the browser sends. ``jobrun ui``'s standard error then holds the
action's audit line.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.nginx import Nginx, free_port
from tests.support import run_in_thread

OPERATE = Path(__file__).parents[2] / "docs" / "how-to" / "operate.md"
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
HOST = "jobs.example.com"


def documented_block() -> str:
    """The how-to's nginx ``location`` block, verbatim."""
    found = re.search(r"```nginx\n(.*?)```", OPERATE.read_text(), re.DOTALL)
    assert found is not None, "operate.md has no nginx block"
    return found.group(1)


def _database(path: Path) -> tuple[str, str]:
    url = f"sqlite+aiosqlite:///{path}"

    async def prepare() -> str:
        engine = create_async_engine(url)
        try:
            await jobrun.upgrade(engine)
            store = jobrun.SqlJobRunStore(engine)
            return (await jobrun.start_job_run(store, module_id="shop", job="sync")).id
        finally:
            await engine.dispose()

    return url, run_in_thread(prepare)


def _status(url: str, run_id: str) -> str:
    async def read() -> str:
        engine = create_async_engine(url)
        try:
            found = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), run_id)
            assert found is not None
            return found.status
        finally:
            await engine.dispose()

    return run_in_thread(read)


def _wait_for_line(path: Path, wanted: str, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60  # bounds a hang only
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if wanted in line:
                return line
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no line with {wanted!r} in jobrun ui's stderr:\n{path.read_text()}")


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[str, str, int, Path, subprocess.Popen[bytes]]]:
    url, run_id = _database(tmp_path / "console.db")
    port = free_port()
    stderr_path = tmp_path / "ui.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobrun", "ui", "--url", url, "--port", str(port),
             "--root-path", "/jobs", "--allowed-host", HOST,
             "--forwarded-allow-ips", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )  # fmt: skip
    try:
        _wait_for_line(stderr_path, "Uvicorn running on", process)
        yield url, run_id, port, stderr_path, process
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_the_documented_block_lets_an_action_through_on_a_port_of_its_own(
    console: tuple[str, str, int, Path, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, run_id, ui_port, stderr_path, process = console
    block = documented_block().replace("127.0.0.1:8080", f"127.0.0.1:{ui_port}")
    with Nginx(tmp_path / "nginx", server=block) as nginx:
        # As a browser that reached nginx by the name jobs.example.com on its port.
        site = f"http://{HOST}:{nginx.port}"
        headers = {"host": f"{HOST}:{nginx.port}"}
        with httpx.Client(base_url=nginx.url, headers=headers, timeout=30) as browser:
            page = browser.get(f"/jobs/db/0/runs/{run_id}")
            assert page.status_code == 200, page.text
            token = TOKEN.search(page.text)
            assert token is not None, "no action form on the run's page"
            cancelled = browser.post(
                f"/jobs/db/0/runs/{run_id}/cancel",
                data={"csrf_token": token.group(1), "reason": "through nginx"},
                headers={"origin": site},
            )
            assert cancelled.status_code == 303, cancelled.text
            # The link back carries the prefix the proxy strips.
            assert cancelled.headers["location"].startswith(f"/jobs/db/0/runs/{run_id}")
    assert _status(url, run_id) == "failed"
    line = _wait_for_line(stderr_path, "console cancel by", process)
    assert "jobrun.ui" in line
    assert f"console cancel by anonymous from 127.0.0.1 on {url}" in line
    assert f"[{run_id}]" in line
