"""Drive jobrun from a plain asyncio program: start runs, then call ``run_due_jobs``
in your own loop until they have all ended (or until SIGINT or SIGTERM).

    python examples/asyncio_loop.py --db loop.db --runs 3

Each run counts the items of a few pages, one page per pass. Kill the program
(Ctrl-C, or ``kill -9``) and run it again: it finds the unfinished runs and drives
them on from their last committed page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

registry = jobrun.JobRegistry()
PAGES = 5


@registry.job("example", "count-pages", retry=jobrun.RetryPolicy(max_attempts=3))
async def count_pages(p: jobrun.JobPass) -> jobrun.PassResult:
    page = p.cursor or 0
    if "total" not in p.counters:
        # Counters are committed with the pass, so this lands exactly once.
        p.count("total", PAGES * p.payload["page_size"])
    # A step's result is stored as soon as it finishes; a replay gets it back.
    items = await p.step(f"fetch-{page}", lambda: fetch_page(p.payload["page_size"]))
    p.count("items", len(items))
    await asyncio.sleep(0.05)  # stands in for real work
    return jobrun.PassResult(cursor=page + 1, done=page + 1 >= PAGES)


def fetch_page(page_size: int) -> list[int]:
    return list(range(page_size))


async def drive(store: jobrun.SqlJobRunStore, stop: asyncio.Event, idle_s: float) -> None:
    """Call the bounded driver again and again; rest when nothing is due."""
    while not stop.is_set():
        report = await jobrun.run_due_jobs(store, registry, max_passes=10, stop=stop)
        # job_runs returns at most 500 records, but one is enough to know work is left.
        left = await jobrun.job_runs(store, module_id="example", status="running", limit=1)
        if not left:
            return
        if report.attempted == 0:
            # Nothing due now (a retry is backing off): wait, but wake at once on stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), idle_s)


async def main(db: str, runs: int, idle_s: float) -> int:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
    try:
        await jobrun.upgrade(engine)  # creates or migrates jobrun's tables
        store = jobrun.SqlJobRunStore(engine)
        started = []
        for number in range(runs):
            # One run per instance: starting a key that is already live joins it.
            run = await jobrun.start_job_run(
                store,
                module_id="example",
                job="count-pages",
                instance=f"batch-{number}",
                payload={"page_size": 10 * (number + 1)},
            )
            started.append(run.id)
            print(f"run {run.id} (batch-{number}): {run.status}, cursor {run.cursor}")

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        await drive(store, stop, idle_s)

        for run_id in started:
            record = await jobrun.get_job_run(store, run_id)
            assert record is not None
            print(f"run {record.id}: {record.status} {record.counters}")
        return 1 if stop.is_set() else 0
    finally:
        await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="loop.db", help="SQLite file (default: loop.db)")
    parser.add_argument("--runs", type=int, default=3, help="runs to start (default: 3)")
    parser.add_argument("--idle", type=float, default=0.5, help="seconds to rest when idle")
    options = parser.parse_args()
    raise SystemExit(asyncio.run(main(options.db, options.runs, options.idle)))
