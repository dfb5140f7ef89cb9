"""A step body that blocks the event loop past its lease ends its process (issue 21 item 3).

The child drives one run on SQLite whose step sleeps synchronously for longer than
the lease: nothing inside the loop can stop it, so the watchdog thread kills the
process before another driver may take the run over. With ``watchdog=False`` the
same body runs to its end (the documented opt-out).

On Postgres, a body blocking the loop (under a long lease) whose presence session
the server terminates is killed within ``HANGUP_KILL_S`` of the termination, before
the grace period after which another host may take the run over.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from asyncio.subprocess import Process
from pathlib import Path

import pytest

CHILD = """
import asyncio, sys, time
import jobrun
from sqlalchemy.ext.asyncio import create_async_engine

async def main(url, watchdog, lease_ms=2000, blocked_s=6):
    engine = create_async_engine(url)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    registry = jobrun.JobRegistry()

    @registry.job("wd", "block", lease_ms=lease_ms)
    async def handler(p):
        def blocks():
            print("body-start", time.monotonic(), flush=True)
            time.sleep(blocked_s)  # holds the event loop: no renewal, no cancellation
            print("body-end", flush=True)
            return 1
        await p.step("block", blocks)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="wd", job="block")
    await jobrun.run_due_jobs(store, registry, watchdog=watchdog)
    print("drive-end", flush=True)
    await engine.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2] == "on", *map(int, sys.argv[3:])))
"""


@pytest.mark.parametrize("watchdog", ["on", "off"])
def test_a_blocking_body_past_its_lease_ends_the_process(tmp_path: Path, watchdog: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'wd.db'}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url, watchdog],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = child.stdout.split()
    assert "body-start" in lines, child.stderr
    if watchdog == "off":
        assert child.returncode == 0, child.stderr
        assert "body-end" in lines
        return
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "body-end" not in lines, "the body was stopped before it ended"
    assert "jobrun watchdog:" in child.stderr
    body_started_s = float(lines[lines.index("body-start") + 1])
    killed_after_s = time.monotonic() - body_started_s  # one system-wide monotonic clock
    print(f"\nwatchdog: killed {killed_after_s:.3f} s into the body (lease 2 s)")
    # Killed before the lease (2 s, counted from the claim, just before the body)
    # could be seen expired by another driver on this host.
    assert killed_after_s < 2.0


async def _start_in_body(url: str, *, lease_ms: int, blocked_s: int) -> Process:
    """The child, watchdog on, once its blocking body has begun."""
    child = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", CHILD, url, "on", str(lease_ms), str(blocked_s)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    first = await asyncio.wait_for(child.stdout.readline(), 60)
    assert first.startswith(b"body-start"), "the body started"
    return child


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_blocked_body_whose_presence_ends_is_killed_within_the_grace(
    backend: str, database_url: str
) -> None:
    import asyncpg
    from sqlalchemy import make_url

    from jobrun._core.leases.proof_of_death import PRESENCE_GRACE_S

    child = await _start_in_body(database_url, lease_ms=600_000, blocked_s=20)
    try:
        admin = await asyncpg.connect(
            make_url(database_url).set(drivername="postgresql").render_as_string(False)
        )
        try:
            killed = await admin.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        finally:
            await admin.close()
        assert len(killed) == 1, "the child's presence was found and terminated"
        terminated_s = time.monotonic()
        returncode = await asyncio.wait_for(child.wait(), 30)
        ended_after_s = time.monotonic() - terminated_s
    finally:
        if child.returncode is None:
            child.kill()
        await child.communicate()
    print(f"\nwatchdog: presence terminated -> process ended {ended_after_s:.3f} s later")
    assert returncode == -signal.SIGKILL
    assert ended_after_s < PRESENCE_GRACE_S, "ended before another host may take over"


async def test_a_process_woken_from_sigstop_past_its_lease_ends_at_once(tmp_path: Path) -> None:
    """Stopped in a body (2 s lease) for 3 s: on SIGCONT the body would run on past
    the instant its run may be taken over, so the watchdog ends the process."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'wd.db'}"
    child = await _start_in_body(url, lease_ms=2000, blocked_s=4)
    try:
        child.send_signal(signal.SIGSTOP)
        # asyncio.sleep: the length of the stop, the fault under test.
        await asyncio.sleep(3)
        woken_s = time.monotonic()
        child.send_signal(signal.SIGCONT)
        returncode = await asyncio.wait_for(child.wait(), 30)
        ended_after_s = time.monotonic() - woken_s
        rest, errors = await child.communicate()
    finally:
        if child.returncode is None:
            child.kill()
            await child.communicate()
    print(f"\nwatchdog: woken from SIGSTOP past the lease -> ended {ended_after_s:.3f} s later")
    assert returncode == -signal.SIGKILL, errors.decode()
    assert b"body-end" not in rest
    assert ended_after_s < 1.0, "ended on waking, not when the body finished (1 s later)"
