"""The jobrun workloads scenarios share: passes of trivial steps, and a pass timed inside."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import jobrun

from .timing import Sample, timed_ms

MODULE_ID = "bench"
Handler = Callable[[jobrun.JobPass], Awaitable[jobrun.PassResult]]


def trivial_steps(count: int, *, cycle: bool = False) -> Handler:
    """A pass of ``count`` new trivial steps (``await p.step(name, lambda: i)``); done, or
    with ``cycle`` the next cursor (the run is due again at once, never ends)."""

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(count):
            await p.step(f"s{index}", lambda index=index: index)
        if cycle:
            return jobrun.PassResult(cursor=(p.cursor or 0) + 1)
        return jobrun.PassResult(done=True)

    return handler


async def drive_one(store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, job: str) -> None:
    """Start a new run of ``bench/<job>`` and drive it through one pass to its end."""
    await jobrun.start_job_run(store, module_id=MODULE_ID, job=job, instance=uuid.uuid4().hex)
    await _drive_started(store, registry)


async def _drive_started(store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry) -> None:
    report = await jobrun.run_due_jobs(store, registry, limit=1)
    assert report.completed == 1, report


def timed_pass(
    store: jobrun.SqlJobRunStore,
    job: str,
    body: Callable[[jobrun.JobPass], Awaitable[Any]],
    count: int,
    registry: jobrun.JobRegistry | None = None,
) -> Sample:
    """A sample: one run of ``bench/<job>`` whose one pass awaits ``body(p)``; ms per item
    (``count`` of them), timed inside the handler, so the claim and the commit are outside."""
    timing: list[float] = []
    registry = jobrun.JobRegistry() if registry is None else registry

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        started = time.perf_counter()
        await body(p)
        timing.append(timed_ms(started, count))
        return jobrun.PassResult(done=True)

    registry.register(MODULE_ID, job, handler)

    async def sample() -> float:
        await drive_one(store, registry, job)
        return timing.pop()

    return sample


def step_runner(store: jobrun.SqlJobRunStore, count: int) -> Sample:
    """A pass of ``count`` new trivial steps; ms per step, timed inside the handler."""
    return timed_pass(store, "steps", trivial_steps(count), count)


def whole_pass_runner(store: jobrun.SqlJobRunStore, count: int) -> Sample:
    """A pass of ``count`` new trivial steps; ms per step, timed around the whole drive
    (the claim, the first step's ledger read, the commit that drops the ledger)."""
    registry = jobrun.JobRegistry()
    registry.register(MODULE_ID, "whole", trivial_steps(count))

    async def sample() -> float:
        instance = uuid.uuid4().hex
        await jobrun.start_job_run(store, module_id=MODULE_ID, job="whole", instance=instance)
        started = time.perf_counter()
        await _drive_started(store, registry)
        return timed_ms(started, count)

    return sample
