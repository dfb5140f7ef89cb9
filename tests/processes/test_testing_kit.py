"""The testing kit: the fake clock drives the engine's waits; the example user test runs.

All on the memory store (autojump is for in-loop stores); no real sleeps anywhere.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

import jobrun
from jobrun.testing import (
    FakeClock,
    MemoryJobRunStore,
    crash_after_step,
    drive_until_idle,
)
from tests.support import REPO


async def test_advancing_wakes_sleepers_in_deadline_order() -> None:
    clock = FakeClock()
    woke: list[str] = []
    asleep = asyncio.Event()

    async def sleeper(name: str, seconds: float) -> None:
        if name == "early":
            asleep.set()  # the sleep below registers before the test runs again
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in [("late", 2), ("early", 1)]]
    await asyncio.wait_for(asleep.wait(), 5)
    assert clock.sleepers == 2
    clock.advance(seconds=1)
    await asyncio.wait_for(tasks[1], 5)
    assert woke == ["early"]
    clock.advance(milliseconds=1000)
    await asyncio.wait_for(tasks[0], 5)
    assert (woke, clock.monotonic(), clock()) == (
        ["early", "late"],
        2.0,
        datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=2),
    )


async def test_a_deadline_on_the_clock_fires_only_when_the_clock_passes_it() -> None:
    clock = FakeClock(autojump=True)
    deadline = clock.timeout(300)
    with pytest.raises(TimeoutError):
        async with deadline:
            await asyncio.Event().wait()
    assert deadline.expired()
    assert clock.monotonic() == 300


async def test_autojump_runs_a_15_minute_lease_through_an_hour_long_step() -> None:
    clock = FakeClock(autojump=True)
    store = MemoryJobRunStore()
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    expiries: list[str | None] = []
    real_extend = store.extend_lease

    async def extend(run_id: str, token: str, expires_at: str, now_at: str) -> bool:
        expiries.append(expires_at)
        return await real_extend(run_id, token, expires_at, now_at)

    store.extend_lease = extend  # type: ignore[method-assign]
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", lease_ms=15 * 60 * 1000)  # renewed every 225 s
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("hour", lambda: clock.sleep(3600))
        return jobrun.PassResult(done=True)

    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.completed, report.superseded) == (1, 0)
    assert clock.monotonic() == 3600
    # Renewed every 225 s; the 16th falls at the step's end, racing the commit.
    assert len(expiries) in (15, 16)
    assert expiries == sorted(set(expiries)), "every renewal pushed the expiry on"
    assert (await jobrun.get_job_run(store, run.id)).status == "done"


async def test_autojump_runs_out_a_300_second_pass_budget() -> None:
    clock = FakeClock(autojump=True)
    store = MemoryJobRunStore()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> None:
        await asyncio.Event().wait()

    report = await jobrun.run_due_jobs(store, registry, clock=clock, pass_timeout_s=300)
    assert report.retrying == 1
    assert "300" in report.errors[0].error
    assert clock.monotonic() == 300


async def test_a_crash_is_replayed_after_the_lease_expires() -> None:
    clock = FakeClock()
    store = MemoryJobRunStore()
    bodies: list[str] = []
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in ("one", "two", "three"):
            await p.step(name, lambda name=name: bodies.append(name))
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    report = await drive_until_idle(store, registry, clock=clock, crash=crash_after_step(1))
    assert report.crashes == 1
    assert report.outcomes() == ["interrupted", "completed"]
    assert report.advanced_s == 60, "the dead pass's lease had to run out first"
    assert report.passes[1].memo_hits() == ["one"]
    assert report.passes[1].ran() == ["two", "three"]
    assert bodies == ["one", "two", "three"]


def test_a_bad_crash_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        crash_after_step(0)


def test_the_example_user_test_passes() -> None:
    """examples/test_my_job.py, run as a user would (plugin enabled by -p)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "jobrun.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "examples/test_my_job.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
