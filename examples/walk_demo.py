"""Walk every object of a flaky external system with jobrun, and survive being killed.

    python examples/walk_demo.py                 # 100,000 objects into ./demo.db
    python examples/walk_demo.py --objects 3000 --page-size 100 --quiet --db /tmp/x.db

The "external system" is a fake, deterministic paged API: object ``i`` always
has the same id and size, and only its flakiness is random (seeded): a share
of page fetches time out, the way a real upstream does.

What the demo shows:

* The walk is ONE run of the job ("demo", "walk-objects"). Each pass handles a
  bounded chunk of pages; every page fetch and every page's processing is a
  step, committed as it finishes; the cursor (the next page) and the counters
  are committed with the pass.
* A timed-out fetch fails the pass. The run waits a few tens of milliseconds
  (its RetryPolicy), then the next pass replays the chunk: the pages already
  fetched come back from the step ledger, and only the failed fetch is tried
  again.
* Ctrl-C or ``kill -9`` at any moment loses at most the steps in flight.
  Running the same command again resumes the same run from its last committed
  page; a committed step never runs twice and no object is counted twice.
* A second copy started while one is driving joins the same run. Both drive
  it: each pass leases the run, so they take turns and never run a pass twice.
  When one copy dies, even by ``kill -9``, the other (or the next copy started)
  takes the run over at once: jobrun proves the dead copy's process is gone,
  so nobody waits for its lease to expire.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import math
import os
import random
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun

MODULE_ID = "demo"
JOB = "walk-objects"

# How a timed-out fetch is retried: quickly, since the simulated upstream
# recovers at once; eight tries make exhausting a step at a 5% failure rate
# a one-in-ten-billion event.
FETCH_RETRY = jobrun.RetryPolicy(max_attempts=8, base_delay_ms=50, max_delay_ms=2_000)
# Anything else that fails a pass (a bug in this file, say) gets a few tries too.
JOB_RETRY = jobrun.RetryPolicy(max_attempts=5, base_delay_ms=200, max_delay_ms=5_000)

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


# --------------------------------------------------------------------------
# The simulated external system.
# --------------------------------------------------------------------------


def object_size(index: int) -> int:
    """The size of object ``index``: arbitrary but fixed, so sums can be checked."""
    return (index * 2_654_435_761) % 4_093 + 1


@dataclass(frozen=True, slots=True)
class Shape:
    """What is being walked. It lives in the run's payload, so a resumed run walks
    the same objects whatever the command line of the resuming process says."""

    objects: int
    page_size: int

    @property
    def pages(self) -> int:
        return math.ceil(self.objects / self.page_size)

    @classmethod
    def of(cls, payload: Any) -> Shape:
        return cls(objects=int(payload["objects"]), page_size=int(payload["page_size"]))


class FakeObjectApi:
    """A paged listing endpoint with latency and transient timeouts."""

    def __init__(self, shape: Shape, *, failure_rate: float, max_latency_ms: float, seed: int):
        self.shape = shape
        self._failure_rate = failure_rate
        self._max_latency_s = max_latency_ms / 1000
        # Seeded, so one process sees the same weather on every run of the demo.
        self._random = random.Random(seed)
        # Failed fetches per page, as seen by this process (for the retries counter).
        self.failures: dict[int, int] = {}
        self.fetches = 0

    async def fetch_page(self, number: int) -> list[dict[str, Any]]:
        self.fetches += 1
        await asyncio.sleep(self._random.uniform(0, self._max_latency_s))
        if self._random.random() < self._failure_rate:
            self.failures[number] = self.failures.get(number, 0) + 1
            raise TimeoutError(f"GET /objects?page={number}: upstream timed out (simulated)")
        first = number * self.shape.page_size
        last = min(first + self.shape.page_size, self.shape.objects)
        return [{"id": f"obj-{i:08d}", "size": object_size(i)} for i in range(first, last)]

    def expected_bytes(self) -> int:
        return sum(object_size(i) for i in range(self.shape.objects))


def process_page(page: list[dict[str, Any]]) -> dict[str, Any]:
    """The work done on one page. Here a digest; in real life an idempotent upsert
    (steps are at-least-once: a kill after the work but before its ledger row
    repeats the work on resume)."""
    digest = hashlib.sha256()
    for item in page:
        digest.update(item["id"].encode())
    return {
        "objects": len(page),
        "bytes": sum(int(item["size"]) for item in page),
        "digest": digest.hexdigest()[:16],
    }


# --------------------------------------------------------------------------
# The job.
# --------------------------------------------------------------------------


class Walker:
    """The job's handler, with this process's view of the fake API."""

    def __init__(self, *, pages_per_pass: int, failure_rate: float, latency_ms: float, seed: int):
        self.pages_per_pass = pages_per_pass
        self._failure_rate = failure_rate
        self._latency_ms = latency_ms
        self._seed = seed
        self._apis: dict[Shape, FakeObjectApi] = {}

    def api_for(self, shape: Shape) -> FakeObjectApi:
        if shape not in self._apis:
            self._apis[shape] = FakeObjectApi(
                shape,
                failure_rate=self._failure_rate,
                max_latency_ms=self._latency_ms,
                seed=self._seed,
            )
        return self._apis[shape]

    async def walk(self, p: jobrun.JobPass) -> jobrun.PassResult:
        shape = Shape.of(p.payload)
        api = self.api_for(shape)
        start = int(p.cursor or 0)
        if "total" not in p.counters:
            # Set once, by the first pass to commit; watchers show a percentage of it.
            p.count("total", shape.objects)
        end = min(start + self.pages_per_pass, shape.pages)
        for number in range(start, end):
            # Replayed passes get committed pages back from the ledger, unfetched.
            page = await p.step(
                f"page-{number}", functools.partial(api.fetch_page, number), retry=FETCH_RETRY
            )
            summary = await p.step(f"process-{number}", functools.partial(process_page, page))
            # Counted outside the steps, on purpose: counters are committed with the
            # pass and dropped when it fails, so a replayed page must count again.
            p.count("objects", summary["objects"])
            p.count("bytes", summary["bytes"])
            # Timeouts this page went through before it was fetched (this process's view).
            p.count("fetch_retries", api.failures.get(number, 0))
        return jobrun.PassResult(cursor=end, done=end >= shape.pages)


# --------------------------------------------------------------------------
# Showing progress.
# --------------------------------------------------------------------------


@dataclass(slots=True)
class Session:
    """What this process did and saw, for the final report and the Ctrl-C message."""

    started: float = field(default_factory=time.monotonic)
    run_id: str | None = None
    page: int = 0
    committed_passes: int = 0
    retried_passes: int = 0
    failed_passes: int = 0
    objects_at_start: int | None = None

    def note(self, run: jobrun.JobRun) -> None:
        self.run_id = run.id
        self.page = int(run.cursor or 0)


def retries_seen(run: jobrun.JobRun) -> int:
    # Committed retries plus the failed passes of the pass now being retried.
    return int(run.counters.get("fetch_retries", 0)) + run.attempts


@contextlib.asynccontextmanager
async def progress_bar(
    store: jobrun.SqlJobRunStore, run_id: str, session: Session, quiet: bool
) -> AsyncIterator[None]:
    """Redraw a bar from the run's committed counters, read like any operator would."""
    if quiet:
        yield
        return
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
    except ImportError:
        print("(no progress bar: install the demo extra, pip install -e '.[demo]')")
        yield
        return

    # Narrow enough for an 80-column terminal.
    progress = Progress(
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("retries {task.fields[retries]}"),
        refresh_per_second=10,
    )
    task = progress.add_task("walk", total=None, rate="", retries=0)
    started = time.monotonic()

    async def refresh() -> None:
        while True:
            run = await jobrun.get_job_run(store, run_id)
            if run is not None:
                done = int(run.counters.get("objects", 0))
                total = int(run.counters.get("total", run.payload["objects"]))
                if session.objects_at_start is None:
                    session.objects_at_start = done
                elapsed = max(time.monotonic() - started, 1e-9)
                rate = (done - session.objects_at_start) / elapsed
                progress.update(
                    task,
                    completed=done,
                    total=total,
                    rate=f"{rate:>7,.0f} obj/s",
                    retries=retries_seen(run),
                )
            await asyncio.sleep(0.1)

    with progress:
        refresher = asyncio.create_task(refresh())
        try:
            yield
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            # One last read, so the bar ends where the run ended.
            run = await jobrun.get_job_run(store, run_id)
            if run is not None:
                total = int(run.counters.get("total", run.payload["objects"]))
                progress.update(
                    task,
                    completed=int(run.counters.get("objects", 0)),
                    total=total,
                    retries=retries_seen(run),
                )


# --------------------------------------------------------------------------
# Driving and watching.
# --------------------------------------------------------------------------


async def drive(
    store: jobrun.SqlJobRunStore,
    registry: jobrun.JobRegistry,
    run_id: str,
    session: Session,
    max_passes: int,
    announce: Callable[[bool], None] | None = None,
) -> jobrun.JobRun:
    """Call the bounded driver until the run is over. Each call does at most
    ``max_passes`` passes, so this loop regularly gets to look at the run. While
    another copy holds the run, a call drives nothing and this loop waits; if
    that copy dies, the next call takes the run over at once."""
    first = True
    while True:
        report = await jobrun.run_due_jobs(store, registry, max_passes=max_passes)
        if first and announce is not None:
            announce(report.attempted > 0)
        first = False
        session.committed_passes += report.advanced + report.completed
        session.retried_passes += report.retrying
        session.failed_passes += report.failed
        run = await jobrun.get_job_run(store, run_id)
        if run is None:
            raise RuntimeError(f"run {run_id} disappeared from the database")
        session.note(run)
        if run.status != jobrun.JobRunStatus.RUNNING:
            return run
        if report.attempted == 0:
            # Nothing was due: the run is backing off after a timeout. Sleep until
            # it is due again rather than asking the database in a tight loop.
            wait = 0.005
            if run.next_attempt_at is not None:
                wait = max(wait, (run.next_attempt_at - datetime.now(UTC)).total_seconds())
            await asyncio.sleep(min(wait, 0.2))


def report_run(
    run: jobrun.JobRun, session: Session, walker: Walker, out: TextIO = sys.stdout
) -> bool:
    """Print the run record; True when its counters agree with the source system."""
    shape = Shape.of(run.payload)
    ended = run.ended_at or datetime.now(UTC)
    counters = ", ".join(f"{name}={value:,}" for name, value in sorted(run.counters.items()))
    objects = int(run.counters.get("objects", 0))
    expected = walker.api_for(shape).expected_bytes()
    exact = objects == shape.objects and int(run.counters.get("bytes", -1)) == expected
    lines = [
        f"run {run.id}: {run.status}",
        f"  job        {run.module_id}/{run.job} (instance {run.instance})",
        f"  walked     {shape.objects:,} objects in {shape.pages:,} pages of {shape.page_size}",
        f"  counters   {counters}",
        f"  attempts   {run.attempts} (consecutive failed passes when it stopped)",
        f"  started    {run.started_at.isoformat(timespec='milliseconds')}",
        f"  ended      {run.ended_at.isoformat(timespec='milliseconds') if run.ended_at else '-'}",
        f"  duration   {(ended - run.started_at).total_seconds():.2f} s in all, "
        f"{time.monotonic() - session.started:.2f} s in this process",
        f"  passes     this process: {session.committed_passes} committed, "
        f"{session.retried_passes} failed and retried, {session.failed_passes} failed for good",
        f"  retries    {int(run.counters.get('fetch_retries', 0))} timed-out page fetches, "
        "each retried by a later pass",
    ]
    if run.last_error:
        lines.append(f"  last error {run.last_error}")
    if run.status == jobrun.JobRunStatus.DONE:
        verdict = "OK" if exact else "MISMATCH"
        lines.append(
            f"  check      objects == {shape.objects:,} and bytes match the source: {verdict}"
        )
    print("\n".join(lines), file=out, flush=True)
    return exact


# --------------------------------------------------------------------------
# The program.
# --------------------------------------------------------------------------


async def open_database(db_path: Path) -> tuple[AsyncEngine, jobrun.SqlJobRunStore]:
    db_path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(f"sqlite+aiosqlite:///{db_path}")
    # The store first: it gives every connection a busy timeout, so two copies
    # upgrading at once wait for each other instead of failing.
    store = jobrun.SqlJobRunStore(engine)
    await jobrun.upgrade(engine)  # idempotent: a no-op on an up-to-date file
    return engine, store


async def run_demo(args: argparse.Namespace, session: Session) -> int:
    walker = Walker(
        pages_per_pass=args.pages_per_pass,
        failure_rate=args.failure_rate,
        latency_ms=args.latency_ms,
        seed=args.seed,
    )
    registry = jobrun.JobRegistry()
    # The default lease: a copy killed mid-pass is proven dead by the next one,
    # which takes the run over at once instead of waiting for the lease.
    registry.register(MODULE_ID, JOB, walker.walk, retry=JOB_RETRY)
    engine, store = await open_database(args.db)
    try:
        # A token of ours in the payload tells "we inserted the run" from "we joined
        # a live one" (on a join the live run's payload wins).
        token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        run = await jobrun.start_job_run(
            store,
            module_id=MODULE_ID,
            job=JOB,
            payload={"objects": args.objects, "page_size": args.page_size, "by": token},
        )
        session.note(run)
        shape = Shape.of(run.payload)
        ours = run.payload.get("by") == token
        if ours:
            print(f"started run {run.id}: {shape.objects:,} objects, {shape.pages:,} pages")
        page = session.page

        def announce(driving: bool) -> None:
            if ours:
                return
            if driving:
                print(f"resuming run {run.id} at page {page} of {shape.pages}", flush=True)
            else:
                print(
                    f"joined live run {run.id} at page {page} of {shape.pages}; "
                    "another copy is driving it, taking turns with it",
                    flush=True,
                )

        if not ours and (shape.objects, shape.page_size) != (args.objects, args.page_size):
            print(
                f"(the run walks {shape.objects:,} objects in pages of {shape.page_size}, "
                "as when it started; --objects/--page-size apply to new runs)"
            )
        sys.stdout.flush()

        async with progress_bar(store, run.id, session, args.quiet):
            final = await drive(store, registry, run.id, session, args.max_passes, announce)
        exact = report_run(final, session, walker)
        if final.status == jobrun.JobRunStatus.DONE and exact:
            return EXIT_DONE
        return EXIT_FAILED
    finally:
        if session.run_id is not None:
            # Interrupted or not, say where the run really stands (best effort).
            with contextlib.suppress(Exception):
                latest = await jobrun.get_job_run(store, session.run_id)
                if latest is not None:
                    session.note(latest)
        await engine.dispose()


def positive_int(text: str) -> int:
    value = int(text.replace("_", "").replace(",", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def rate(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Walk the objects of a flaky fake API as one resumable jobrun run.",
        epilog="Interrupt it at any time; run the same command again to resume.",
    )
    parser.add_argument("--db", type=Path, default=Path("demo.db"), help="SQLite file")
    parser.add_argument("--objects", type=positive_int, default=100_000, help="objects to walk")
    parser.add_argument("--page-size", type=positive_int, default=500, help="objects per page")
    parser.add_argument(
        "--pages-per-pass", type=positive_int, default=4, help="pages one pass handles"
    )
    parser.add_argument(
        "--max-passes", type=positive_int, default=5, help="passes per run_due_jobs call"
    )
    parser.add_argument(
        "--failure-rate", type=rate, default=0.05, help="share of page fetches that time out"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=2.0, help="simulated fetch latency: 0 to this many ms"
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the simulated flakiness")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.latency_ms < 0:
        parser.error("--latency-ms must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    session = Session()

    async def guarded() -> int:
        # SIGTERM ends the process like Ctrl-C does: the pass in flight is simply
        # not committed, which is exactly what a crash would leave.
        task = asyncio.current_task()
        assert task is not None
        cancel: Callable[[], Any] = task.cancel
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, cancel)
        return await run_demo(args, session)

    try:
        return asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        where = f"run {session.run_id}" if session.run_id else "the run"
        print(
            f"\ninterrupted: {where} is saved in {args.db} at page {session.page}; "
            "run the same command again to resume it.",
            flush=True,
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
