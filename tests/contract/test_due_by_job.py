"""Due runs per job: how a job that no driver registers becomes visible (all backends)."""

from __future__ import annotations

from typing import Any

import jobrun
from jobrun.testing import FakeClock


async def test_job_run_health_counts_due_runs_per_job(store: Any, clock: FakeClock) -> None:
    for instance in ("a", "b"):
        await jobrun.start_job_run(store, module_id="m", job="j", instance=instance, clock=clock)
    await jobrun.start_job_run(store, module_id="m", job="k", clock=clock)
    # The pair is the key: ("m/j", "x") is another job than ("m", "j/x").
    await jobrun.start_job_run(store, module_id="m/j", job="x", clock=clock)
    health = await jobrun.job_run_health(store, by_job=True, clock=clock)
    assert health.due_by_job == {("m", "j"): 2, ("m", "k"): 1, ("m/j", "x"): 1}
    assert (await jobrun.job_run_health(store, clock=clock)).due_by_job == {}


async def test_leased_and_backing_off_runs_are_not_due(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()

    def failing(p: jobrun.JobPass) -> jobrun.PassResult:
        raise RuntimeError("later")

    registry.register("m", "j", failing)
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.start_job_run(store, module_id="m", job="k", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.retrying == 1
    # m/j backs off (not due); m/k is registered nowhere and stays due.
    health = await jobrun.job_run_health(store, by_job=True, clock=clock)
    assert health.due_by_job == {("m", "k"): 1}
