"""The two takeover checks of ``check_pgbouncer``: a killed driver, and a live one whose
presence session ends. Both time what the presence lock decides (see ``docs/design.md``,
"Proof of death"), directly and through PgBouncer.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

import jobrun
from benchmarks import harness
from benchmarks.processes.pgbouncer import Target, stores

HELD_LOCKS = (
    "SELECT pid, (classid::bigint << 32) | objid::bigint AS key FROM pg_locks "
    "WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)
Check = Callable[[Target], Awaitable[tuple[bool, str]]]


async def lock_holders(target: Target) -> dict[int, int]:
    """Session advisory locks held in the database (presences, here): key to backend pid."""
    connection = await asyncpg.connect(harness.plain_url(target.direct))
    try:
        return {row["key"]: row["pid"] for row in await connection.fetch(HELD_LOCKS)}
    finally:
        await connection.close()


def mark(path: str) -> None:
    Path(path).write_text("in the body")


def exists(path: Path) -> bool:
    return path.exists()


def holding_driver(target: Target, lease_ms: int, marker: str) -> None:
    """A driver process that claims the run and stays in its step body (until killed)."""

    async def hold() -> None:
        registry = jobrun.JobRegistry()

        async def body() -> None:
            mark(marker)
            await asyncio.sleep(600)  # the body in flight when the process is killed

        async def pass_(p: jobrun.JobPass) -> jobrun.PassResult:
            await p.step("work", body)
            return jobrun.PassResult(done=True)

        registry.register("check", "hold", pass_, lease_ms=lease_ms)
        async with stores(target) as [store]:
            await jobrun.run_due_jobs(store, registry, limit=1)

    asyncio.run(hold())


async def wait_for_file(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the driver process never reached its step body ({path})")
        await asyncio.sleep(0.05)  # poll interval for the child's marker file


async def take_over(
    store: jobrun.SqlJobRunStore, lease_ms: int, timeout_s: float
) -> tuple[float | None, int]:
    """Drive until this process runs the held run's step body: when (monotonic s), claims."""
    registry = jobrun.JobRegistry()
    stepped: list[float] = []

    async def pass_(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("work", lambda: stepped.append(time.monotonic()))
        return jobrun.PassResult(done=True)

    registry.register("check", "hold", pass_, lease_ms=lease_ms)
    deadline, tries = time.monotonic() + timeout_s, 0
    while not stepped and time.monotonic() < deadline:
        tries += 1
        report = await jobrun.run_due_jobs(store, registry, limit=1)
        if report.attempted == 0:
            await asyncio.sleep(0.1)  # poll interval of the driver waiting to take over
    return (stepped[0] if stepped else None), tries


def kill_takeover(lease_ms: int) -> Check:
    """A driver process killed (SIGKILL) in a step body; another takes the run over."""

    async def check(target: Target) -> tuple[bool, str]:
        marker = Path(tempfile.mkdtemp(prefix="jobrun-kill-")) / "in-body"
        context = multiprocessing.get_context("spawn")
        async with stores(target) as [store]:
            await jobrun.start_job_run(store, module_id="check", job="hold")
            child = context.Process(target=holding_driver, args=(target, lease_ms, str(marker)))
            child.start()
            try:
                await wait_for_file(marker, 60)
                # The child's presence, the only lock held so far.
                keys = set(await lock_holders(target))
            finally:
                os.kill(child.pid or 0, signal.SIGKILL)
                child.join()
            killed_at = time.monotonic()
            stepped_at, _ = await take_over(store, lease_ms, lease_ms / 1000 + 20)
            outlived = keys & set(await lock_holders(target))
        if stepped_at is None:
            return False, "never taken over"
        taken_s = stepped_at - killed_at
        detail = (
            f"taken over {taken_s:.1f} s after the kill (lease {lease_ms / 1000:.0f} s); "
            f"the dead driver's presence lock {'is still held' if outlived else 'went with it'}"
        )
        # At once means proof of death; waiting out the lease means none was found.
        return taken_s < min(3.0, lease_ms / 2000), detail

    return check


async def live_holder(target: Target) -> tuple[bool, str]:
    """A live driver's presence session ends under it (``pg_terminate_backend`` of the
    session holding its lock): does it stop its body before another driver's starts?"""
    lease_ms, marks = 20_000, {}
    registry = jobrun.JobRegistry()
    in_body = asyncio.Event()

    async def slow_body() -> None:
        marks["holder started"] = time.monotonic()
        in_body.set()
        try:
            await asyncio.sleep(10)  # the holder's long step body
            marks["holder stopped"] = time.monotonic()
        except asyncio.CancelledError:
            marks["holder stopped"] = time.monotonic()
            marks["holder cancelled"] = 1.0
            raise

    async def pass_(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("work", slow_body)
        return jobrun.PassResult(done=True)

    registry.register("check", "hold", pass_, lease_ms=lease_ms)
    async with stores(target, 2) as (holder, other):
        await jobrun.start_job_run(holder, module_id="check", job="hold")
        holding = asyncio.ensure_future(jobrun.run_due_jobs(holder, registry, limit=1))
        await in_body.wait()
        await end_sessions(target, list((await lock_holders(target)).values()))
        ended_at = time.monotonic()
        stepped_at, _ = await take_over(other, lease_ms, 15)
        with contextlib.suppress(Exception):
            await holding
    return judged_overlap(marks, ended_at, stepped_at)


async def end_sessions(target: Target, pids: list[int]) -> None:
    connection = await asyncpg.connect(harness.plain_url(target.direct))
    try:
        for pid in pids:
            await connection.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


def judged_overlap(
    marks: dict[str, float], ended_at: float, stepped_at: float | None
) -> tuple[bool, str]:
    stopped = marks.get("holder stopped", float("inf"))
    how = "cancelled" if "holder cancelled" in marks else "ran on"
    stop = f"the holder's body stopped ({how}) {stopped - ended_at:.1f} s after its session ended"
    if stepped_at is None:
        return True, f"{stop}; no other driver took the run within 15 s"
    overlap_s = max(0.0, stopped - stepped_at)
    taken = f"another driver's body started {stepped_at - ended_at:.1f} s after"
    return overlap_s == 0, f"{stop}; {taken}; two bodies at once for {overlap_s:.1f} s"
