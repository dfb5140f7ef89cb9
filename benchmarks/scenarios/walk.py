"""The 100,000-object walk: one step per object, a pass per page, to the end, per dialect.

One run walks ``--objects`` objects in pages of ``--page`` (one step per object,
the cursor the next page) through ``run_due_jobs`` until done. Reports objects
per second, ms per object, the process's RSS growth and the largest ledger seen
(at most one page). ``--profile`` prints where the time goes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import jobrun
from benchmarks import harness


async def walk(store: jobrun.SqlJobRunStore, objects: int, page: int) -> dict[str, Any]:
    largest = 0

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        nonlocal largest
        first = p.cursor or 0
        last = min(first + page, objects)
        for number in range(first, last):
            await p.step(f"o{number}", lambda number=number: number)
        # The ledger at its fullest, just before the commit drops it.
        largest = max(largest, len(await store.steps(p.run.id)))
        return jobrun.PassResult(cursor=last, done=last >= objects)

    registry = jobrun.JobRegistry()
    registry.register("bench", "walk", handler)
    run = await jobrun.start_job_run(
        store, module_id="bench", job="walk", instance=uuid.uuid4().hex
    )
    before = harness.rss_mb()
    started = time.perf_counter()
    # The run was just started: it exists (hence the ignore of the Optional).
    while (await jobrun.get_job_run(store, run.id)).status == "running":  # type: ignore[union-attr]
        await jobrun.run_due_jobs(store, registry, limit=1, max_passes=1_000_000)
    elapsed = time.perf_counter() - started
    return {
        "objects_per_s": round(objects / elapsed),
        "ms_per_object": round(elapsed * 1000 / objects, 4),
        "rss_growth_mb": round(harness.rss_mb() - before, 2),
        "largest_ledger_rows": largest,
    }


async def scenario(args: Any) -> None:
    objects = 2_000 if args.quick else args.objects
    results: dict[str, Any] = {}
    rows = []
    for backend in harness.backends(args):
        engine = await args.databases.engine(backend)
        store = jobrun.SqlJobRunStore(engine)
        results[backend] = await walk(store, objects, args.page)
        found = results[backend]
        rows.append(
            [
                backend,
                f"{objects:,}",
                f"{found['objects_per_s']:,}",
                found["ms_per_object"],
                found["rss_growth_mb"],
                found["largest_ledger_rows"],
            ]
        )
        if args.profile:
            results[backend]["profile"] = await harness.profiled(
                f"{backend}: walk of {objects // 10:,}",
                lambda store=store: walk(store, objects // 10, args.page),
            )
        await engine.dispose()
    harness.table(
        f"walk of {objects:,} objects, one step each, {args.page} per pass",
        ["", "objects", "objects/s", "ms/object", "RSS growth MB", "ledger max"],
        rows,
    )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, objects=100_000, page=1_000)
