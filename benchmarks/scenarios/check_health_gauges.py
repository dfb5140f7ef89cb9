"""The health gauges of a Postgres worker on two long runs that advance normally.

An on-demand check (issue 33 item 2), not a speed benchmark: ``run_worker``
(concurrency 2, interval 0.5 s) drives two runs of many short passes on a fresh
database, and its ``on_health`` callback (what ``WorkerMetrics.record_health``
sets the gauges from) is sampled 40 times. It prints the samples that counted a
run due and the largest "oldest due age" seen: a run between two claims is due,
and should have waited about nothing, not since it began.

    .venv/bin/python -m benchmarks check_health_gauges
    JOBRUN_BENCH_CODE=/path/to/older/checkout .venv/bin/python -m benchmarks check_health_gauges
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from benchmarks import harness

SAMPLES = 40


def long_runs() -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job("check", "long", lease_ms=5000)
    async def long(p: jobrun.JobPass) -> dict[str, Any]:
        page = int(p.cursor or 0)
        for index in range(5):
            await p.step(f"s{index}", lambda: asyncio.sleep(0.02, result=1))
        return {"cursor": page + 1, "done": page >= 4000}

    return registry


async def sampled(url: str) -> list[tuple[int, int, float]]:
    engine = create_async_engine(url)
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        for instance in ("a", "b"):
            await jobrun.start_job_run(store, module_id="check", job="long", instance=instance)
        samples: list[tuple[int, int, float]] = []
        stop = asyncio.Event()

        def on_health(_database: str, health: jobrun.JobRunHealth) -> None:
            samples.append((health.due, health.leased, round(health.oldest_due_age_s, 2)))
            if len(samples) >= SAMPLES:
                stop.set()

        await jobrun.run_worker(
            [store], long_runs(), concurrency=2, stop=stop, interval_s=0.5, on_health=on_health
        )
        return samples
    finally:
        await engine.dispose()


async def scenario(args: Any) -> None:
    samples = await sampled(await args.databases.postgres_url())
    due = [sample for sample in samples if sample[0] > 0]
    print(f"(due, leased, oldest due age s) where due > 0, {len(due)} of {len(samples)}: {due}")
    # The first sample comes before any claim: the runs' real wait since they started.
    largest = max(sample[2] for sample in samples[1:])
    print(f"largest oldest due age after the first sample: {largest} s")
    harness.save(args, {"samples": samples, "largest_oldest_due_age_s_after_the_first": largest})


if __name__ == "__main__":
    harness.run(scenario)
