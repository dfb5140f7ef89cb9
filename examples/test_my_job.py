"""Testing a job of your own with jobrun's testing kit.

Enable the fixtures in your top-level conftest.py (or run ``pytest -p jobrun.pytest_plugin``):

    pytest_plugins = ["jobrun.pytest_plugin"]

The job below imports three pages one step each; the tests check that it
finishes through a retry without waiting for the backoff, that a crash after the
second step replays the finished steps from the ledger, and that it runs the same
on a real (SQLite) database.
"""

from __future__ import annotations

import pytest

import jobrun
from jobrun.testing import FakeClock, crash_after_step, drive_until_idle

PAGES = ["a", "b", "c"]
fetched: list[str] = []
flaky = {"failures_left": 0}


def make_registry() -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job("shop", "import", retry=jobrun.RetryPolicy(base_delay_ms=60_000))
    async def import_pages(p: jobrun.JobPass) -> jobrun.PassResult:
        for page in PAGES:
            await p.step(f"fetch {page}", lambda page=page: fetch(page))
        return jobrun.PassResult(cursor=len(PAGES), done=True)

    return registry


def fetch(page: str) -> str:
    if flaky["failures_left"]:
        flaky["failures_left"] -= 1
        raise ConnectionError("the shop is down")
    fetched.append(page)
    return page.upper()


@pytest.fixture(autouse=True)
def fresh_world() -> None:
    fetched.clear()
    flaky["failures_left"] = 0


@pytest.mark.asyncio
async def test_a_retry_runs_without_waiting_for_its_backoff(jobrun_memory_store, jobrun_clock):
    flaky["failures_left"] = 1
    run = await jobrun.start_job_run(
        jobrun_memory_store, module_id="shop", job="import", clock=jobrun_clock
    )
    report = await drive_until_idle(jobrun_memory_store, make_registry(), clock=jobrun_clock)

    assert report.outcomes() == ["retrying", "completed"]
    assert report.advanced_s >= 48, "the clock jumped over the one-minute backoff (jitter 0.8-1.2)"
    assert fetched == ["a", "b", "c"]
    assert (await jobrun.get_job_run(jobrun_memory_store, run.id)).status == "done"


@pytest.mark.asyncio
async def test_a_crash_after_two_steps_replays_them_from_the_ledger(
    jobrun_memory_store, jobrun_clock
):
    await jobrun.start_job_run(
        jobrun_memory_store, module_id="shop", job="import", clock=jobrun_clock
    )
    report = await drive_until_idle(
        jobrun_memory_store, make_registry(), clock=jobrun_clock, crash=crash_after_step(2)
    )

    crashed, replay = report.passes
    assert report.crashes == 1
    assert crashed.end.outcome == "interrupted", "killed right after recording 'fetch b'"
    assert replay.end.outcome == "completed"
    assert replay.memo_hits() == ["fetch a", "fetch b"]
    assert replay.ran() == ["fetch c"]
    assert fetched == ["a", "b", "c"], "no page was fetched twice"


@pytest.mark.asyncio
async def test_it_runs_the_same_on_sqlite(jobrun_sqlite_store):
    clock = FakeClock()  # a SQL store does real I/O: move this clock by hand, or let the kit
    await jobrun.start_job_run(jobrun_sqlite_store, module_id="shop", job="import", clock=clock)
    report = await drive_until_idle(jobrun_sqlite_store, make_registry(), clock=clock)

    assert report.outcomes() == ["completed"]
    assert fetched == ["a", "b", "c"]
