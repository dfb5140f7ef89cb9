"""Races between hosts sharing one database, on SQLite and on Postgres.

* A start racing the pass that completes the run: the starter joins the live
  run or gets a new one, never a finished run, never a second live run.
* Two drivers over many runs: with a lease longer than any pass, every step
  body runs once and nothing is superseded; with a lease deliberately too short
  (renewals that never arrive, steps longer than the lease) the test measures
  what overlap costs and holds it to the contract's bounds: only a step that was
  cut off may run twice, a recorded step is never run again, a run never goes
  backwards, and every stale pass is counted as superseded.

In-process variants use asyncio tasks with one engine each (separate
connections); the process variants use two spawned OS processes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import multiprocessing
import os
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from tests.support import SQL_BACKENDS, logged_store

MODULE = "races"
JOB = "walk"
KEY = {"module_id": MODULE, "job": JOB, "instance": "contested"}
TIMEOUT = 50.0
NO_WAIT = jobrun.RetryPolicy(max_attempts=1000, base_delay_ms=0)


async def live_rows(store: jobrun.SqlJobRunStore) -> list[jobrun.JobRun]:
    return await jobrun.job_runs(store, **KEY, status="running")


# --- a start racing the completing pass -------------------------------------------------


def _completing_registry(rng: random.Random) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB)
    async def complete(p: jobrun.JobPass) -> jobrun.PassResult:
        # sleep: seeded jitter: passes end in varied orders
        await asyncio.sleep(rng.uniform(0, 0.004))
        return jobrun.PassResult(done=True)

    return registry


def _check_start(
    joined: jobrun.JobRun, old_id: str, old_after: jobrun.JobRun, live: list[jobrun.JobRun]
) -> str:
    """The contract for one round; returns "joined" or "new"."""
    assert joined.status == "running", "the starter was handed a finished run"
    assert len(live) <= 1, f"two live runs: {[run.id for run in live]}"
    if joined.id == old_id:
        # Joined the old run while it was live (the record read says running);
        # the drive then finished it.
        assert old_after.status == "done"
        assert live == []
        return "joined"
    assert old_after.status == "done", "a new run was started beside a live one"
    assert [run.id for run in live] == [joined.id]
    return "new"


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_start_racing_the_completing_pass_tasks(database_url: str) -> None:
    rng = random.Random(7)
    driver_engine = create_async_engine(database_url)
    starter_engine = create_async_engine(database_url)
    try:
        driver_store = jobrun.SqlJobRunStore(driver_engine)
        starter_store = jobrun.SqlJobRunStore(starter_engine)
        registry = _completing_registry(rng)
        seen: collections.Counter[str] = collections.Counter()
        current = await jobrun.start_job_run(starter_store, **KEY)
        for _ in range(30):
            old_id = current.id

            async def start_later() -> jobrun.JobRun:
                # sleep: seeded jitter: starts land at varied points of the pass
                await asyncio.sleep(rng.uniform(0, 0.01))
                return await jobrun.start_job_run(starter_store, **KEY)

            report, joined = await asyncio.gather(
                jobrun.run_due_jobs(driver_store, registry, limit=1), start_later()
            )
            assert report.completed >= 1
            old_after = await jobrun.get_job_run(starter_store, old_id)
            assert old_after is not None
            seen[_check_start(joined, old_id, old_after, await live_rows(starter_store))] += 1
            live = await live_rows(starter_store)
            current = live[0] if live else await jobrun.start_job_run(starter_store, **KEY)
        print(f"start vs completing pass (tasks): {dict(seen)}")
    finally:
        await driver_engine.dispose()
        await starter_engine.dispose()


ROUNDS = 30


def _race_process(role: str, url: str, barrier: Any, results: Any, seed: int) -> None:
    asyncio.run(_race_role(role, url, barrier, results, seed))


async def _race_role(role: str, url: str, barrier: Any, results: Any, seed: int) -> None:
    rng = random.Random(seed)
    engine = create_async_engine(url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        registry = _completing_registry(rng)
        await store.get("0" * 26)  # schema check and a warm connection before the race
        for round_ in range(ROUNDS):
            await asyncio.to_thread(barrier.wait, TIMEOUT)
            try:
                if role == "driver":
                    # sleep: seeded jitter between the racing roles
                    await asyncio.sleep(rng.uniform(0, 0.004))
                    report = await jobrun.run_due_jobs(store, registry, limit=1)
                    results.put((round_, role, report.completed, None))
                else:
                    # sleep: seeded jitter between the racing roles
                    await asyncio.sleep(rng.uniform(0, 0.012))
                    run = await jobrun.start_job_run(store, **KEY)
                    results.put((round_, role, (run.id, run.status), None))
            except Exception as error:
                results.put((round_, role, None, f"{type(error).__name__}: {error}"))
    finally:
        await engine.dispose()


def _spawn(target: Any, args_list: list[tuple[Any, ...]]) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=args, daemon=True) for args in args_list]
    for process in processes:
        process.start()
    return processes


def _reap(processes: list[Any]) -> list[int | None]:
    for process in processes:
        process.join(timeout=TIMEOUT)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode for process in processes]


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_start_racing_the_completing_pass_processes(
    database_url: str, engine: AsyncEngine
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3)
    results = context.Queue()
    processes = _spawn(
        _race_process,
        [
            ("driver", database_url, barrier, results, 1),
            ("starter", database_url, barrier, results, 2),
        ],
    )
    store = jobrun.SqlJobRunStore(engine)
    seen: collections.Counter[str] = collections.Counter()
    try:
        current = await jobrun.start_job_run(store, **KEY)
        for round_ in range(ROUNDS):
            await asyncio.to_thread(barrier.wait, TIMEOUT)
            got = {}
            for _ in range(2):
                got_round, role, value, error = await asyncio.to_thread(results.get, True, TIMEOUT)
                assert error is None, f"{role}: {error}"
                assert got_round == round_
                got[role] = value
            joined_id, joined_status = got["starter"]
            joined = await jobrun.get_job_run(store, joined_id)
            old_after = await jobrun.get_job_run(store, current.id)
            assert joined is not None
            assert old_after is not None
            assert joined_status == "running", "the starter was handed a finished run"
            returned = dataclasses.replace(joined, status=joined_status)
            seen[_check_start(returned, current.id, old_after, await live_rows(store))] += 1
            live = await live_rows(store)
            current = live[0] if live else await jobrun.start_job_run(store, **KEY)
    finally:
        barrier.abort()
        exit_codes = _reap(processes)
        results.close()
        results.join_thread()
    print(f"start vs completing pass (processes): {dict(seen)}")
    assert exit_codes == [0, 0]


# --- two drivers over many runs ----------------------------------------------------------


@dataclass
class Execution:
    """One run of a step body: which step, who ran it, when, and whether it was recorded."""

    run_id: str
    cursor: int
    step: str
    driver: str
    began: float
    ended: float = 0.0
    recorded: bool = False

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.run_id, self.cursor, self.step)


class Walker:
    """A job of ``PASSES`` passes of ``STEPS`` steps each, logging every step body.

    ``slow_s`` makes the first execution of each step that slow (``blocking`` with
    ``time.sleep``, which starves this process's lease renewals, as a GC pause or a
    CPU-bound step would); ``first_marks`` is a directory shared between processes
    where a step's first execution leaves a mark.
    """

    PASSES = 3
    STEPS = 2

    def __init__(
        self,
        driver: str,
        *,
        slow_s: float = 0.0,
        blocking: bool = False,
        first_marks: Path | None = None,
    ) -> None:
        self.driver = driver
        self.slow_s = slow_s
        self.blocking = blocking
        self.first_marks = first_marks
        self.executions: list[Execution] = []
        self._firsts: set[tuple[str, int, str]] = set()

    def _first_time(self, key: tuple[str, int, str]) -> bool:
        if self.first_marks is None:
            if key in self._firsts:
                return False
            self._firsts.add(key)
            return True
        mark = self.first_marks / f"{key[0]}-{key[1]}-{key[2]}"
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    async def handler(self, p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = p.cursor or 0
        for index in range(self.STEPS):
            name = f"s{index}"
            execution = Execution(p.run.id, cursor, name, self.driver, 0.0)

            async def body(execution: Execution = execution) -> list[Any]:
                execution.began = time.time()
                self.executions.append(execution)
                if self.slow_s and self._first_time(execution.key):
                    if self.blocking:
                        time.sleep(self.slow_s)  # noqa: ASYNC251 - the point: starve the loop
                    else:
                        # sleep: the slow step, on the loop (the other case blocks it)
                        await asyncio.sleep(self.slow_s)
                else:
                    # sleep: a short step, so passes interleave
                    await asyncio.sleep(0.001)
                execution.ended = time.time()
                return [execution.driver, execution.began]

            memo = await p.step(name, body)
            if execution.began and memo == [execution.driver, execution.began]:
                execution.recorded = True
                execution.ended = time.time()
        p.count("passes")
        return jobrun.PassResult(cursor=cursor + 1, done=cursor + 1 >= self.PASSES)

    def registry(self, lease_ms: int) -> jobrun.JobRegistry:
        registry = jobrun.JobRegistry()
        registry.register(
            MODULE, JOB, self.handler, retry=NO_WAIT, lease_ms=lease_ms, max_takeovers=10_000
        )
        return registry


class NoRenewals:
    """A store whose lease renewals never reach the database (always "too late")."""

    def __init__(self, inner: jobrun.SqlJobRunStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def extend_lease(self, run_id: str, token: str, expires_at: str, now_at: str) -> bool:
        return True


async def drive_until_all_done(
    store: Any, registry: jobrun.JobRegistry, driver: str, tally: collections.Counter[str]
) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        # The watchdog off: these drivers measure what overlap a lease too short
        # for its steps costs when nothing ends the process (the documented opt-out);
        # with it on, a blocking 0.3 s body under a 100 ms lease ends its process.
        report = await jobrun.run_due_jobs(
            store, registry, driver_name=driver, limit=5, max_passes=2, watchdog=False
        )
        for outcome in ("advanced", "completed", "retrying", "failed", "superseded"):
            tally[outcome] += getattr(report, outcome)
        if not await jobrun.job_runs(store, status="running", limit=1):
            return
        if report.attempted == 0:
            # sleep: a poll interval; TIMEOUT only bounds a hang
            await asyncio.sleep(0.01)
    raise AssertionError(f"driver {driver} gave up: runs still running after {TIMEOUT} s")


class CursorWatch:
    """Polls every run and fails if any cursor goes backwards or a finished run revives."""

    def __init__(self, store: jobrun.SqlJobRunStore) -> None:
        self._store = store
        self.highest: dict[str, int] = {}
        self.finished: set[str] = set()
        self.polls = 0
        self.problems: list[str] = []

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            # sleep: a poll interval of the watcher
            await asyncio.sleep(0.01)
        await self.poll()

    async def poll(self) -> None:
        self.polls += 1
        for run in await jobrun.job_runs(self._store, limit=500):
            cursor = -1 if run.cursor is None else int(run.cursor)
            if cursor < self.highest.get(run.id, -1):
                self.problems.append(f"{run.id} went back to cursor {cursor}")
            if run.id in self.finished and run.status != "done":
                self.problems.append(f"{run.id} was done and is {run.status} again")
            self.highest[run.id] = max(cursor, self.highest.get(run.id, -1))
            if run.status == "done":
                self.finished.add(run.id)


async def start_runs(store: jobrun.SqlJobRunStore, count: int) -> list[str]:
    ids = []
    for index in range(count):
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance=f"r{index}")
        ids.append(run.id)
    return ids


def check_overlap_bounds(
    executions: list[Execution], run_ids: list[str], superseded: int
) -> dict[str, int]:
    """The contract's bounds on what two drivers did; returns the measured numbers."""
    by_key: dict[tuple[str, int, str], list[Execution]] = collections.defaultdict(list)
    for execution in executions:
        by_key[execution.key].append(execution)
    expected = {
        (run_id, cursor, f"s{index}")
        for run_id in run_ids
        for cursor in range(Walker.PASSES)
        for index in range(Walker.STEPS)
    }
    assert set(by_key) == expected, "a step of some pass never ran"
    cut_after_writing = 0
    for key, runs in by_key.items():
        recorded = [execution for execution in runs if execution.recorded]
        # At most one execution's result was recorded; every other pass got its memo.
        assert len(recorded) <= 1, f"{key}: {len(recorded)} recorded results"
        if not recorded:
            # The self-fence cancelled the pass while the step's write was landing:
            # the result is in the ledger, but the step never returned to its pass.
            cut_after_writing += 1
            continue
        (winner,) = recorded
        # No body began after the step's result was recorded: a memo is never re-run.
        for execution in runs:
            assert execution.began <= winner.ended, f"{key} ran again after it was recorded"
    assert cut_after_writing <= superseded
    repeated = len(executions) - len(by_key)
    # Each repeat is the step a stale pass was in when it lost its lease, and
    # that pass is counted superseded.
    assert repeated <= superseded
    return {"step bodies": len(executions), "repeated": repeated, "superseded": superseded}


async def check_runs_done(store: jobrun.SqlJobRunStore, run_ids: list[str]) -> int:
    takeovers = 0
    for run_id in run_ids:
        record = await jobrun.get_job_run(store, run_id)
        assert record is not None
        assert (record.status, record.cursor) == ("done", Walker.PASSES)
        # Counters count committed passes: a superseded pass's count never landed.
        assert record.counters == {"passes": Walker.PASSES}
        takeovers += record.lease_takeovers
    return takeovers


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("lease", ["long", "too-short"])
async def test_two_drivers_in_one_process(database_url: str, lease: str) -> None:
    engines = [create_async_engine(database_url) for _ in range(3)]
    try:
        watcher_store = jobrun.SqlJobRunStore(engines[2])
        run_ids = await start_runs(watcher_store, 12 if lease == "long" else 3)
        walkers = [Walker(f"d{n}", slow_s=0.3 if lease == "too-short" else 0.0) for n in range(2)]
        stores: list[Any] = [jobrun.SqlJobRunStore(engine) for engine in engines[:2]]
        if lease == "too-short":
            stores = [NoRenewals(store) for store in stores]
        lease_ms = 100 if lease == "too-short" else 15 * 60 * 1000
        tallies = [collections.Counter[str]() for _ in walkers]
        watch = CursorWatch(watcher_store)
        stop = asyncio.Event()
        watching = asyncio.create_task(watch.watch(stop))
        try:
            await asyncio.gather(
                *(
                    drive_until_all_done(store, walker.registry(lease_ms), walker.driver, tally)
                    for store, walker, tally in zip(stores, walkers, tallies, strict=True)
                )
            )
        finally:
            stop.set()
            await watching
        assert watch.problems == []
        executions = [execution for walker in walkers for execution in walker.executions]
        superseded = sum(tally["superseded"] for tally in tallies)
        measured = check_overlap_bounds(executions, run_ids, superseded)
        measured["takeovers"] = await check_runs_done(watcher_store, run_ids)
        measured["cursor polls"] = watch.polls
        print(f"two drivers, {lease} lease, tasks: {measured}")
        assert sum(tally["failed"] + tally["retrying"] for tally in tallies) == 0
        if lease == "long":
            assert measured["repeated"] == 0
            assert superseded == 0
        else:
            assert superseded >= 1, "the too-short lease produced no overlap to measure"
    finally:
        for engine in engines:
            await engine.dispose()


def _driver_process(url: str, driver: str, lease_ms: int, marks: str, results: Any) -> None:
    asyncio.run(_driver_role(url, driver, lease_ms, marks, results))


async def _driver_role(url: str, driver: str, lease_ms: int, marks: str, results: Any) -> None:
    engine = create_async_engine(url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        slow = lease_ms < 1000
        walker = Walker(driver, slow_s=0.3 if slow else 0.0, blocking=slow, first_marks=Path(marks))
        tally: collections.Counter[str] = collections.Counter()
        try:
            await drive_until_all_done(store, walker.registry(lease_ms), driver, tally)
        except Exception as error:
            results.put((driver, None, None, f"{type(error).__name__}: {error}"))
        else:
            results.put((driver, walker.executions, dict(tally), None))
    finally:
        await engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("lease", ["long", "too-short"])
async def test_two_driver_processes(database_url: str, tmp_path: Path, lease: str) -> None:
    watcher_engine = create_async_engine(database_url)
    try:
        watcher_store = jobrun.SqlJobRunStore(watcher_engine)
        run_ids = await start_runs(watcher_store, 12 if lease == "long" else 3)
        lease_ms = 100 if lease == "too-short" else 15 * 60 * 1000
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        watch = CursorWatch(watcher_store)
        stop = asyncio.Event()
        watching = asyncio.create_task(watch.watch(stop))
        processes = _spawn(
            _driver_process,
            [(database_url, f"p{n}", lease_ms, str(tmp_path), results) for n in range(2)],
        )
        try:
            outcomes = [await asyncio.to_thread(results.get, True, TIMEOUT + 5) for _ in range(2)]
        finally:
            stop.set()
            await watching
            exit_codes = _reap(processes)
            results.close()
            results.join_thread()
        assert exit_codes == [0, 0]
        for driver, _, _, error in outcomes:
            assert error is None, f"{driver}: {error}"
        assert watch.problems == []
        executions = [execution for _, done, _, _ in outcomes for execution in done]
        superseded = sum(tally["superseded"] for _, _, tally, _ in outcomes)
        measured = check_overlap_bounds(executions, run_ids, superseded)
        measured["takeovers"] = await check_runs_done(watcher_store, run_ids)
        measured["cursor polls"] = watch.polls
        print(f"two drivers, {lease} lease, processes: {measured}")
        assert sum(tally["failed"] + tally["retrying"] for _, _, tally, _ in outcomes) == 0
        if lease == "long":
            assert measured["repeated"] == 0
            assert superseded == 0
    finally:
        await watcher_engine.dispose()


# --- prune racing resume ------------------------------------------------------------------------


async def _failed_run_with_a_ledger(store: jobrun.SqlJobRunStore) -> str:
    """A run that completed step ``a``, then failed; ended an hour ago."""
    registry = jobrun.JobRegistry()

    @registry.job(MODULE, JOB, retry=jobrun.RetryPolicy(max_attempts=1))
    async def handler(p: jobrun.JobPass) -> None:
        await p.step("a", lambda: "done once")
        raise RuntimeError("fails after step a")

    run = await jobrun.start_job_run(store, **KEY)
    report = await jobrun.run_due_jobs(store, registry)
    assert report.failed == 1
    return run.id


@pytest.mark.parametrize("backend", SQL_BACKENDS[1:])
async def test_prune_blocked_behind_a_resume_deletes_nothing_and_counts_nothing(
    backend: str, database_url: str
) -> None:
    """Postgres: prune chooses the failed run, then waits on its row, which a resume
    is writing; the resume commits. The delete must re-check the status as it
    deletes (remove ``status != 'running'`` from it and this test fails)."""
    engine = create_async_engine(database_url)
    try:
        store = jobrun.SqlJobRunStore(engine)
        run_id = await _failed_run_with_a_ledger(store)
        async with engine.connect() as resumer:
            # The resume's write, held open: its row lock makes prune wait.
            await resumer.execute(
                text(
                    "UPDATE _substrat_job_runs SET status = 'running', ended_at = NULL "
                    "WHERE id = :id"
                ),
                {"id": run_id},
            )
            pruning = asyncio.create_task(
                jobrun.prune_job_runs(store, older_than=timedelta(0), statuses=("failed",))
            )
            async with engine.connect() as watcher:
                # Until prune's delete waits on the row; 60 s only bounds a hang (a count
                # of polls was once too few on a loaded machine).
                deadline = time.monotonic() + 60
                while not await watcher.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                        "'Lock' AND query LIKE 'DELETE FROM _substrat_job_runs%'"
                    )
                ):
                    assert not pruning.done(), f"prune ended without waiting: {pruning}"
                    assert time.monotonic() < deadline, "prune never waited on the resumed row"
                    # sleep: a poll interval; the deadline only bounds a hang
                    await asyncio.sleep(0.02)
            await resumer.commit()
        assert await asyncio.wait_for(pruning, 30) == 0, "prune counted a deletion it did not make"
        row = await store.get(run_id)
        assert row is not None
        assert row.status == "running"
        assert set(await store.steps(run_id)) == {"a"}, "the resumed run kept its ledger"
    finally:
        await engine.dispose()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_resume_landing_as_prune_starts_writing_keeps_its_ledger(
    backend: str, database_url: str
) -> None:
    """The resume commits right before prune's first write (after the moment the
    old prune had chosen its ids): the resumed run and its ledger stay."""
    engine = create_async_engine(database_url)
    try:
        store, log = logged_store(engine)
        run_id = await _failed_run_with_a_ledger(store)
        other = create_async_engine(database_url)
        resumed: list[bool] = []
        # SQLite's prune takes the write lock at BEGIN IMMEDIATE, so the last moment
        # another host can still commit is just before it; Postgres takes row locks
        # only as its DELETE runs.
        first_write = "DELETE" if backend == "postgres" else "BEGIN"

        async def resume_now(operation: str, sql: str) -> None:
            if operation == "prune" and sql.lstrip().startswith(first_write) and not resumed:
                resumed.append(True)
                # Another host's resume, committed while prune is about to write.
                await jobrun.resume_job_run(jobrun.SqlJobRunStore(other), run_id)

        log.before = resume_now
        try:
            pruned = await jobrun.prune_job_runs(
                store, older_than=timedelta(0), statuses=("failed",)
            )
        finally:
            log.before = None
            await other.dispose()
        assert resumed == [True]
        assert pruned == 0
        row = await store.get(run_id)
        assert row is not None
        assert row.status == "running"
        assert set(await store.steps(run_id)) == {"a"}
    finally:
        await engine.dispose()


# --- run_worker on a pool of one connection -----------------------------------------------------


@pytest.mark.parametrize("backend", SQL_BACKENDS[1:])
async def test_run_worker_makes_progress_on_a_pool_of_one(backend: str, database_url: str) -> None:
    """The LISTEN connection is not taken from the host's pool (it would be its only one)."""
    engine = create_async_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=60)
    try:
        store = jobrun.SqlJobRunStore(engine)
        registry = jobrun.JobRegistry()

        @registry.job(MODULE, JOB)
        async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
            await p.step("one", lambda: 1)
            return jobrun.PassResult(done=True)

        for index in range(20):
            await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance=f"i{index}")
        stop = asyncio.Event()
        worker = asyncio.create_task(
            jobrun.run_worker([engine], registry, concurrency=8, interval_s=0.2, stop=stop)
        )
        try:
            for _ in range(600):
                if len(await jobrun.job_runs(store, status="done", limit=500)) == 20:
                    break
                # sleep: a poll interval; the loop count only bounds a hang
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
        assert len(await jobrun.job_runs(store, status="done", limit=500)) == 20
    finally:
        await engine.dispose()
