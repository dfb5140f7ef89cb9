"""NUL cannot be stored in Postgres text, so jobrun refuses or escapes it everywhere alike."""

from __future__ import annotations

import pytest

import jobrun


@pytest.mark.parametrize("field", ["module_id", "job", "instance"])
async def test_a_nul_in_a_key_part_is_refused_before_anything_is_written(store, clock, field):
    key = {"module_id": "m", "job": "j", "instance": "i"} | {field: "a\x00b"}
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.start_job_run(store, clock=clock, **key)
    assert caught.value.errors == [
        {"path": field, "message": "contains a NUL character (Postgres cannot store it)"}
    ]
    assert await jobrun.job_runs(store) == []


async def test_a_nul_in_an_error_message_is_stored_escaped(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> None:
        await p.step("fine", lambda: 1)
        raise RuntimeError("bad\x00byte")

    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.retrying == 1
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.last_error == "RuntimeError: bad\\x00byte"


async def test_a_nul_in_a_step_name_fails_the_run_without_writing_the_step(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> None:
        await p.step("a\x00b", lambda: 1)

    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.failed == 1
    assert "NUL" in report.errors[0].error
    assert await store.steps(run.id) == {}
