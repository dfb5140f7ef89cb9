"""Where a failure was raised is kept beside ``last_error`` (revision 0006's
``error_origin``), whose ``Type: message`` text stays as it was."""

from __future__ import annotations

import inspect
from typing import Any

import jobrun
from tests.support import drive, registry_for, row_of, start_id

RETRY = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=1000)


def fetch_page() -> None:
    raise ValueError("upstream said no")


RAISING_LINE = inspect.getsourcelines(fetch_page)[1] + 1


async def test_a_failed_step_keeps_the_line_that_raised_until_a_commit(store: Any, clock: Any):
    failing = [True]

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fetch", fetch_page if failing else (lambda: 1))
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    registry = registry_for(handler, retry=RETRY)
    assert (await drive(store, registry, clock)).retrying == 1
    row = await row_of(store, run_id)
    assert row.last_error == "step 'fetch' failed: ValueError: upstream said no"
    assert row.error_origin is not None
    assert row.error_origin.endswith(f"test_error_origin.py:{RAISING_LINE} in fetch_page")
    record = await jobrun.get_job_run(store, run_id)
    assert record is not None
    assert record.error_origin == row.error_origin
    failing.clear()
    clock.advance(seconds=2)
    assert (await drive(store, registry, clock)).completed == 1
    assert (await row_of(store, run_id)).error_origin is None


async def test_a_handler_error_has_its_origin_and_jobruns_own_errors_none(store: Any, clock: Any):
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if p.payload == "mistake":
            await p.step("", lambda: 1)  # a bad step name: jobrun's own error
        {}["missing"]
        return jobrun.PassResult(done=True)

    raised = await start_id(store, clock, instance="raised")
    mistaken = await start_id(store, clock, instance="mistaken", payload="mistake")
    await drive(store, registry_for(handler, retry=RETRY), clock)
    origin = (await row_of(store, raised)).error_origin
    assert origin is not None
    assert " in handler" in origin
    assert (await row_of(store, raised)).last_error == "KeyError: 'missing'"
    mistake = await row_of(store, mistaken)
    assert mistake.status == "failed"
    assert mistake.error_origin is None


async def test_a_resume_and_a_cancel_clear_the_origin(store: Any, clock: Any):
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fetch", fetch_page)
        return jobrun.PassResult(done=True)

    once = jobrun.RetryPolicy(max_attempts=1)
    run_id = await start_id(store, clock)
    assert (await drive(store, registry_for(handler, retry=once), clock)).failed == 1
    assert (await row_of(store, run_id)).error_origin is not None
    await jobrun.resume_job_run(store, run_id, clock=clock)
    assert (await row_of(store, run_id)).error_origin is None
    assert (await drive(store, registry_for(handler, retry=RETRY), clock)).retrying == 1
    assert (await row_of(store, run_id)).error_origin is not None
    await jobrun.cancel_job_run(store, run_id, "enough", clock=clock)
    assert (await row_of(store, run_id)).error_origin is None
