"""The health gauges of a worker on long runs that advance normally (issue 33 item 2).

Between two claims of a long run its row has no lease and no next attempt written:
it is due (a driver may take it now), and it has waited since the commit that
released it, not since the run began. The gauges are :func:`jobrun.job_run_health`
as ``jobrun health`` prints it, so both say the same at the same instant; the
exposition passes ``promtool check metrics``.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import jobrun
from jobrun.prometheus import WorkerMetrics
from jobrun.testing import FakeClock

PASS_S = 30.0
PASSES = 4


def long_runs_registry(clock: FakeClock) -> jobrun.JobRegistry:
    """``m/long``: each pass takes ``PASS_S`` on ``clock`` and advances the cursor; the
    run ends after ``PASSES`` passes."""
    registry = jobrun.JobRegistry()

    @registry.job("m", "long", lease_ms=120_000)
    async def walk(p: jobrun.JobPass) -> dict[str, Any]:
        done = int(p.cursor or 0)
        clock.advance(seconds=PASS_S)
        await p.step(f"page-{done}", lambda: done)
        return {"cursor": done + 1, "done": done + 1 >= PASSES}

    return registry


def gauges(metrics: WorkerMetrics) -> dict[str, float]:
    """The health gauges of database ``db`` as the exposition serves them."""
    text = generate_latest(metrics.registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("database") == "db"
    }


async def promtool_check(metrics: WorkerMetrics) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (the Prometheus package provides it)")
    checker = await asyncio.create_subprocess_exec(
        promtool,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(checker.communicate(generate_latest(metrics.registry)), 60)
    assert checker.returncode == 0, output.decode()


async def test_long_runs_between_claims_have_waited_since_their_last_pass(
    store: Any, clock: FakeClock
) -> None:
    registry = long_runs_registry(clock)
    for instance in ("a", "b"):
        await jobrun.start_job_run(store, module_id="m", job="long", instance=instance, clock=clock)
    metrics = WorkerMetrics(CollectorRegistry())
    for number in range(1, PASSES):
        # Each call gives each run one pass; both are then between passes, unleased.
        report = await jobrun.run_due_jobs(store, registry, clock=clock)
        assert report.attempted == 2
        health = await jobrun.job_run_health(store, clock=clock)
        metrics.record_health("db", health)
        seen = gauges(metrics)
        # Both wait for a driver (so due), each since its own pass's commit: the later
        # one since now, the earlier one since the other's pass began, one pass ago.
        assert (health.running, health.due, health.leased) == (2, 2, 0), number
        assert health.oldest_due_age_s == PASS_S, (number, health)
        assert seen["jobrun_due_runs"] == health.due
        assert seen["jobrun_oldest_due_age_seconds"] == health.oldest_due_age_s
        assert seen["jobrun_leased_runs"] == health.leased
        await promtool_check(metrics)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.oldest_due_age_s) == (0, 0, 0.0)


async def test_a_run_handed_on_between_passes_is_leased_not_due(
    store: Any, clock: FakeClock
) -> None:
    """Within one claim (``max_passes`` above 1) the lease goes on to the next pass: read
    from inside that pass, before its first step, the run is leased and nothing is due."""
    registry = jobrun.JobRegistry()
    seen: list[jobrun.JobRunHealth] = []

    @registry.job("m", "long", lease_ms=120_000)
    async def walk(p: jobrun.JobPass) -> dict[str, Any]:
        done = int(p.cursor or 0)
        if done > 0:
            seen.append(await jobrun.job_run_health(store, clock=clock))
        clock.advance(seconds=PASS_S)
        await p.step(f"page-{done}", lambda: done)
        return {"cursor": done + 1, "done": done + 1 >= PASSES}

    await jobrun.start_job_run(store, module_id="m", job="long", instance="a", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock, max_passes=PASSES)
    assert report.attempted == 1
    assert [(health.due, health.leased, health.oldest_due_age_s) for health in seen] == [
        (0, 1, 0.0)
    ] * (PASSES - 1)


async def test_paused_runs_have_their_own_gauge_and_are_not_due(
    store: Any, clock: FakeClock
) -> None:
    for instance in ("a", "b", "c"):
        await jobrun.start_job_run(store, module_id="m", job="long", instance=instance, clock=clock)
    [first, *_] = await jobrun.job_runs(store, module_id="m", job="long")
    await jobrun.pause_job_run(store, first.id, reason="held", clock=clock)
    clock.advance(seconds=PASS_S)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.paused) == (3, 2, 1)
    metrics = WorkerMetrics(CollectorRegistry())
    metrics.record_health("db", health)
    seen = gauges(metrics)
    assert (seen["jobrun_paused_runs"], seen["jobrun_due_runs"]) == (1, 2)
    await promtool_check(metrics)
