"""Walk 100,000 objects of a flaky fake API as one resumable jobrun run.

    python examples/walk_demo.py     # into ./demo.db; --help for the options

The fake API is paged and fixed (object ``i`` always has the same id and size),
except that a share of page fetches time out. The walk is one run of the job
("demo", "walk-objects"). Each pass handles a few pages; every page fetch and
every page's processing is a step, committed as it finishes, and the cursor
(the next page) is committed with the pass. A timed-out fetch fails the pass;
the step's retry policy backs the run off briefly, and the next pass gets the
finished steps back from the ledger and fetches again only what failed.

Kill it (Ctrl-C, ``kill -9``) and run the same command again: it resumes the
same run from its last committed page. Start a second copy while one runs: it
joins the same run and both drive it, one pass at a time each (every pass
leases the run); if one copy dies, the other takes the run over. At the end the
counters are checked against the source: every object counted exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import random
import secrets
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun

MODULE_ID, JOB = "demo", "walk-objects"
PAGES_PER_PASS = 4
PASSES_PER_CALL = 1  # per run_due_jobs call: the loop below reads the run after each
# pass, so a progress line is printed at the pass that crosses its mark
REPORT_EVERY = 10_000  # objects between two progress lines
# The fake upstream recovers at once, so retry soon; eight tries make losing a
# step at a 5% failure rate a one-in-ten-billion event.
FETCH_RETRY = jobrun.RetryPolicy(max_attempts=8, base_delay_ms=50, max_delay_ms=2_000)


def object_size(index: int) -> int:
    """Arbitrary but fixed, so the bytes counter can be checked at the end."""
    return (index * 2_654_435_761) % 4_093 + 1


class FlakyApi:
    """A paged listing endpoint with latency and transient timeouts."""

    def __init__(self, payload: Any, failure_rate: float, latency_ms: float) -> None:
        self.objects, self.page_size = int(payload["objects"]), int(payload["page_size"])
        self.pages = math.ceil(self.objects / self.page_size)
        self.failure_rate, self.latency_s = failure_rate, latency_ms / 1000
        self.random = random.Random()
        self.timeouts = 0

    async def fetch_page(self, number: int) -> list[dict[str, Any]]:
        await asyncio.sleep(self.random.uniform(0, self.latency_s))
        if self.random.random() < self.failure_rate:
            self.timeouts += 1
            raise TimeoutError(f"GET /objects?page={number}: upstream timed out (simulated)")
        first = number * self.page_size
        last = min(first + self.page_size, self.objects)
        return [{"id": f"obj-{i:08d}", "size": object_size(i)} for i in range(first, last)]


def process_page(page: list[dict[str, Any]]) -> dict[str, int]:
    # In real life an idempotent upsert: a kill between the work and its ledger
    # row repeats the work on resume (steps are at least once).
    return {"objects": len(page), "bytes": sum(item["size"] for item in page)}


def walk_job(api: FlakyApi) -> Callable[[jobrun.JobPass], Awaitable[jobrun.PassResult]]:
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        start = int(p.cursor or 0)
        if "total" not in p.counters:
            p.count("total", api.objects)  # `jobrun watch` draws its bar against it
        end = min(start + PAGES_PER_PASS, api.pages)
        for number in range(start, end):
            fetch = functools.partial(api.fetch_page, number)
            page = await p.step(f"page-{number}", fetch, retry=FETCH_RETRY)
            summary = await p.step(f"process-{number}", functools.partial(process_page, page))
            # Counted outside the steps on purpose: a failed pass drops its
            # counters, so a replayed page must count again.
            p.count("objects", summary["objects"])
            p.count("bytes", summary["bytes"])
        return jobrun.PassResult(cursor=end, done=end >= api.pages)

    return walk


async def drive(
    store: jobrun.SqlJobRunStore, registry: jobrun.JobRegistry, run: jobrun.JobRun, pages: int
) -> tuple[jobrun.JobRun, int]:
    """Call the bounded driver until the run ends; the run and the passes we committed."""
    committed, reported = 0, int(run.counters.get("objects", 0)) // REPORT_EVERY
    while True:
        report = await jobrun.run_due_jobs(store, registry, max_passes=PASSES_PER_CALL)
        committed += report.advanced + report.completed
        latest = await jobrun.get_job_run(store, run.id)
        if latest is None:
            raise RuntimeError(f"run {run.id} disappeared from the database")
        objects = int(latest.counters.get("objects", 0))
        if objects // REPORT_EVERY > reported:
            reported = objects // REPORT_EVERY
            print(f"{objects:>9,} objects walked, page {latest.cursor} of {pages}", flush=True)
        if latest.status != jobrun.JobRunStatus.RUNNING:
            return latest, committed
        if report.attempted == 0:
            # Nothing was due: the run is backing off, or the other copy holds it.
            await asyncio.sleep(0.05)


def jobrun_command() -> str:
    """The jobrun CLI installed beside this Python, as typed from here."""
    script = Path(sys.executable).with_name("jobrun")
    relative = os.path.relpath(script)
    return str(script) if relative.startswith("..") else relative


async def walk_demo(args: argparse.Namespace) -> int:
    engine = create_async_engine(f"sqlite+aiosqlite:///{args.db}")
    # The store before the upgrade: it gives every connection a busy timeout, so
    # two copies upgrading the same file at once wait for each other.
    store = jobrun.SqlJobRunStore(engine)
    try:
        await jobrun.upgrade(engine)  # a no-op on an up-to-date file
        # Our token in the payload tells "we started the run" from "we found it
        # live" (then its payload wins: a resumed run keeps its shape).
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        payload = {"objects": args.objects, "page_size": args.page_size, "by": token}
        run = await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, payload=payload)
        api = FlakyApi(run.payload, args.failure_rate, args.latency_ms)
        if run.payload["by"] == token:
            print(f"started run {run.id}: {api.objects:,} objects in {api.pages} pages")
        else:
            # Left by a killed copy or driven by a live one: this copy drives it too.
            print(f"resuming run {run.id} at page {run.cursor or 0} of {api.pages}")
        watch = f"{jobrun_command()} watch {run.id} --url sqlite:///{args.db}"
        print(f"follow it with: {watch}")
        if not args.latency_given:
            print(
                "to watch it go, slow it down: --latency-ms 200 (make demo DEMO='--latency-ms 200')"
            )
        print("interrupt it (Ctrl-C) and run the same command again to resume it", flush=True)
        registry = jobrun.JobRegistry()
        registry.register(MODULE_ID, JOB, walk_job(api))
        final, committed = await drive(store, registry, run, api.pages)
    finally:
        await engine.dispose()
    counters = ", ".join(f"{name}={value:,}" for name, value in sorted(final.counters.items()))
    print(f"run {final.id}: {final.status}, {counters}")
    print(f"this copy committed {committed} passes and retried {api.timeouts} timed-out fetches")
    if final.status != jobrun.JobRunStatus.DONE:
        print(f"last error: {final.last_error}")
        return 1
    expected = sum(object_size(i) for i in range(api.objects))
    exact = final.counters.get("objects") == api.objects and final.counters["bytes"] == expected
    print(f"every object counted once, bytes match the source: {'OK' if exact else 'MISMATCH'}")
    return 0 if exact else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--db", type=Path, default=Path("demo.db"), help="the SQLite file (default demo.db)")
    add("--objects", type=int, default=100_000, help="objects in a new run (default 100,000)")
    add("--page-size", type=int, default=500, help="objects per page in a new run (default 500)")
    add("--failure-rate", type=float, default=0.05, help="share of fetches that time out")
    add("--latency-ms", type=float, help="each fetch takes 0 to this many ms (default 2)")
    args = parser.parse_args()
    # Only a demo run at the default speed is told how to slow it down.
    args.latency_given = args.latency_ms is not None
    if args.latency_ms is None:
        args.latency_ms = 2.0
    if args.objects < 1 or args.page_size < 1 or args.latency_ms < 0:
        parser.error("--objects and --page-size must be at least 1, --latency-ms at least 0")
    if not 0 <= args.failure_rate < 1:
        parser.error("--failure-rate must be at least 0 and below 1")
    return args


def main() -> int:
    args = parse_args()
    try:
        return asyncio.run(walk_demo(args))
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume the run", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
