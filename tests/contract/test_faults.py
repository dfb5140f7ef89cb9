"""Faults from outside the handler: a dropped connection, a locked or read-only
database, a hanging handler, an interruption at any await.

What each test asks is the same: nothing is half-written (the commit applied
wholly, cursor moved and ledger dropped, or not at all), the error that escapes
(if any) says what failed, and the next drive picks the run up and finishes it
without repeating a step whose result was recorded.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import RunRow, StepRow
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, StatementLog, drive, logged_store, row_of

MODULE = "faults"
JOB = "walk"
IMMEDIATE = jobrun.RetryPolicy(max_attempts=50, base_delay_ms=0)
SHORT_LEASE_MS = 200
POSTGRES_ONLY = [pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


# --- helpers -----------------------------------------------------------------------------


class TwoSteps:
    """A job of one pass: steps ``a`` and ``b``, then done with cursor ``"end"``.

    ``before_b`` (if set) runs inside step ``b``'s body, where a fault is injected.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.before_b: Callable[[], Awaitable[None]] | None = None

    async def handler(self, p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: self._call("a"))
        await p.step("b", self._b)
        return jobrun.PassResult(cursor="end", done=True)

    def _call(self, name: str) -> str:
        self.calls.append(name)
        return name.upper()

    async def _b(self) -> str:
        if self.before_b is not None:
            fault, self.before_b = self.before_b, None
            await fault()
        return self._call("b")

    def registry(self) -> jobrun.JobRegistry:
        registry = jobrun.JobRegistry()
        registry.register(MODULE, JOB, self.handler, retry=IMMEDIATE, lease_ms=SHORT_LEASE_MS)
        return registry


async def assert_whole(store: Any, run_id: str, committed_cursor: str | None) -> None:
    """The run shows a pass either committed wholly or not at all."""
    row = await row_of(store, run_id)
    ledger = await store.steps(run_id)
    if row.cursor == committed_cursor:
        assert row.status == "running"
        assert row.ended_at is None
    else:
        assert ledger == {}, f"the cursor moved to {row.cursor} but the ledger survived"


async def finish(store: Any, registry: jobrun.JobRegistry, clock: FakeClock, run_id: str) -> RunRow:
    """Drive until the run is no longer running, waiting out any lease left behind."""
    for _ in range(10):
        row = await row_of(store, run_id)
        if row.status != "running":
            return row
        if row.lease_owner is not None:
            clock.advance(milliseconds=SHORT_LEASE_MS + 1)
        await drive(store, registry, clock)
    raise AssertionError(f"run {run_id} did not finish: {await row_of(store, run_id)}")


# --- Postgres: the server drops the driver's connection ---------------------------------


def _admin_dsn(engine: AsyncEngine | None = None) -> str:
    """A plain DSN of the test server; on ``engine``'s database when given."""
    url = make_url(os.environ["JOBRUN_TEST_POSTGRES_URL"]).set(drivername="postgresql")
    if engine is not None:
        url = url.set(database=engine.url.database)
    return url.render_as_string(False)


class BackendKiller:
    """Cuts the database's connections just before a chosen statement of the store is sent.

    ``plan`` lists statement prefixes; the n-th occurrence of a prefix (counted
    from 1) is the one before which every server backend of the database (the
    statement's own connection among them) is terminated. Installed as the
    store's statement hook, so the store runs the path users run.
    """

    def __init__(self, log: StatementLog, admin: asyncpg.Connection, plan: list[str]) -> None:
        self._admin = admin
        self._plan = collections.Counter(plan)
        self._seen: collections.Counter[str] = collections.Counter()
        self.killed: list[str] = []
        log.before = self._before

    async def _before(self, _operation: str, statement: str) -> None:
        for prefix in list(self._plan):
            if statement.startswith(prefix):
                self._seen[prefix] += 1
                if self._plan[prefix] and self._seen[prefix] == self._plan[prefix]:
                    del self._plan[prefix]
                    # Wait (up to 5 s each) until the backends are really gone.
                    cut = await self._admin.fetchval(
                        "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    assert cut >= 1
                    self.killed.append(prefix)


STEP_WRITE = "INSERT INTO _substrat_job_steps"
COMMIT = "WITH written AS"
FAILURE_RECORD = "UPDATE _substrat_job_runs SET status"


@pytest.mark.parametrize("backend", POSTGRES_ONLY)
@pytest.mark.parametrize(
    ("plan", "escapes", "ledger_after", "calls"),
    [
        # Step b's write loses its connection: a failed pass, b runs again.
        ([STEP_WRITE, STEP_WRITE], None, ["a"], ["a", "b", "b"]),
        # The commit loses its connection: a failed pass, nothing repeated.
        ([COMMIT], None, ["a", "b"], ["a", "b"]),
        # The commit and then the failure record lose theirs: the store error
        # escapes the drive, the lease stays until it expires.
        ([COMMIT, FAILURE_RECORD], "patch", ["a", "b"], ["a", "b"]),
        ([STEP_WRITE, STEP_WRITE, FAILURE_RECORD], "patch", ["a"], ["a", "b", "b"]),
    ],
    ids=["step-write", "commit", "commit-then-failure-record", "step-write-then-failure-record"],
)
async def test_a_dropped_connection_mid_pass_leaves_the_run_whole(
    engine: AsyncEngine,
    clock: FakeClock,
    plan: list[str],
    escapes: str | None,
    ledger_after: list[str],
    calls: list[str],
) -> None:
    # The n-th listed occurrence of a prefix is cut (a repeated prefix means "the 2nd").
    admin = await asyncpg.connect(_admin_dsn(engine))
    try:
        store, log = logged_store(engine)
        job = TwoSteps()
        registry = job.registry()
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        killer = BackendKiller(log, admin, plan)

        if escapes is None:
            report = await drive(store, registry, clock)
            assert report.retrying == 1
            assert report.errors[0].run_id == run.id
            assert "failed" in report.errors[0].error
            row = await row_of(store, run.id)
            assert row.lease_owner is None, "a recorded failure hands the lease back"
        else:
            with pytest.raises(jobrun.StoreError) as caught:
                await drive(store, registry, clock)
            assert caught.value.operation == escapes
            assert caught.value.__cause__ is not None
            row = await row_of(store, run.id)
            assert row.lease_owner is not None, "nothing could be written, not even a hand-back"
            assert len(store.owed_releases) == 1, "the failure record is owed"
        assert sorted(killer.killed) == sorted(set(plan))
        assert (row.status, row.cursor, row.counters) == ("running", None, "{}")
        assert sorted(await store.steps(run.id)) == ledger_after
        await assert_whole(store, run.id, None)
        if escapes is not None:
            # The next drive writes the owed failure record first and takes the run at
            # once: the clock never moved, so its lease did not have to expire.
            assert (await drive(store, registry, clock)).completed == 1
            assert len(store.owed_releases) == 0

        final = await finish(store, registry, clock, run.id)
        assert (final.status, final.cursor, final.attempts) == ("done", '"end"', 0)
        assert (final.lease_owner, final.lease_takeovers) == (None, 0)
        assert await store.steps(run.id) == {}
        assert job.calls == calls, "a recorded step ran again"
    finally:
        await admin.close()


@pytest.mark.parametrize("backend", POSTGRES_ONLY)
async def test_every_connection_of_the_database_cut_from_inside_a_step(
    engine: AsyncEngine, database_url: str, clock: FakeClock
) -> None:
    admin = await asyncpg.connect(_admin_dsn())
    try:
        store = jobrun.SqlJobRunStore(engine)
        job = TwoSteps()
        registry = job.registry()
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        database = make_url(database_url).database
        cuts: list[asyncio.Future[int]] = []

        async def cut_everything() -> None:
            # Open a few pooled connections first, so idle ones are cut too.
            async with engine.connect() as one, engine.connect() as two:
                await one.exec_driver_sql("SELECT 1")
                await two.exec_driver_sql("SELECT 1")
            # A task of its own: the pass, which sees its presence cut within 0.5 s,
            # may be stopped while pg_terminate_backend still waits for the backends.
            terminating = asyncio.ensure_future(
                admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
                    "WHERE datname = $1 AND pid <> pg_backend_pid()",
                    database,
                )
            )
            cuts.append(terminating)
            await asyncio.shield(terminating)

        job.before_b = cut_everything
        try:
            report = await drive(store, registry, clock)
        except jobrun.StoreError as error:
            # Acceptable only as a store error that names its operation.
            print(f"escaped: {error}")
        else:
            print(f"report: {report}")
        assert cuts
        assert await cuts[0] >= 1
        await assert_whole(store, run.id, None)
        final = await finish(store, registry, clock, run.id)
        assert (final.status, final.cursor) == ("done", '"end"')
        assert job.calls[:2] == ["a", "b"]
        assert job.calls.count("a") == 1
    finally:
        await admin.close()


# --- SQLite: a lock held by someone else, a read-only file -------------------------------


def _path_of(url: str) -> Path:
    database = make_url(url).database
    assert database is not None
    return Path(database)


class WriteLock:
    """Another connection holding SQLite's write lock (``BEGIN IMMEDIATE``)."""

    def __init__(self, path: Path) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.held = False

    def take(self) -> None:
        self._connection.execute("BEGIN IMMEDIATE")
        self.held = True

    def drop(self) -> None:
        if self.held:
            self._connection.execute("ROLLBACK")
            self.held = False

    def close(self) -> None:
        self.drop()
        self._connection.close()


@pytest.fixture
async def busy_store(sqlite_url: str) -> AsyncIterator[tuple[jobrun.SqlJobRunStore, WriteLock]]:
    """A SQLite store that waits 100 ms for a busy file, and a write lock on that file."""
    engine = create_async_engine(sqlite_url)
    lock = WriteLock(_path_of(sqlite_url))
    try:
        yield jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=100), lock
    finally:
        lock.close()
        await engine.dispose()


def _assert_locked(error: jobrun.StoreError, operation: str) -> None:
    assert error.operation == operation
    assert str(error).startswith(f"{operation} failed")
    assert "locked" in str(error)
    assert isinstance(error.__cause__, Exception)


async def test_a_held_write_lock_is_a_clear_store_error_and_the_run_survives(
    busy_store: tuple[jobrun.SqlJobRunStore, WriteLock], clock: FakeClock
) -> None:
    store, lock = busy_store
    job = TwoSteps()
    registry = job.registry()
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    before = await row_of(store, run.id)

    lock.take()
    with pytest.raises(jobrun.StoreError) as started:
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, instance="x", clock=clock)
    _assert_locked(started.value, "start_or_join")
    with pytest.raises(jobrun.StoreError) as driven:
        await drive(store, registry, clock)
    _assert_locked(driven.value, "claim")
    with pytest.raises(jobrun.StoreError) as cancelled:
        await jobrun.cancel_job_run(store, run.id, "no", clock=clock)
    _assert_locked(cancelled.value, "cancel")
    # Reads go on beside the writer (WAL), and show the run untouched.
    assert await row_of(store, run.id) == before
    assert [found.id for found in await jobrun.job_runs(store)] == [run.id]
    lock.drop()

    assert (await drive(store, registry, clock)).completed == 1
    assert (await row_of(store, run.id)).status == "done"
    assert job.calls == ["a", "b"]


async def test_a_write_lock_taken_mid_pass_escapes_and_the_next_drive_finishes(
    busy_store: tuple[jobrun.SqlJobRunStore, WriteLock], clock: FakeClock
) -> None:
    store, lock = busy_store
    job = TwoSteps()
    registry = job.registry()
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)

    async def take() -> None:
        lock.take()

    job.before_b = take
    # Step b's write waits out the busy timeout, then so does the failure record.
    with pytest.raises(jobrun.StoreError) as caught:
        await drive(store, registry, clock)
    _assert_locked(caught.value, "patch")
    row = await row_of(store, run.id)
    assert (row.status, row.cursor, row.attempts) == ("running", None, 0)
    assert row.lease_owner is not None
    assert await store.steps(run.id) == {"a": StepRow("a", '"A"', 1, None)}
    lock.drop()

    # The operator may hand the lease back at once instead of waiting for it.
    assert await jobrun.release_job_lease(store, run.id)
    report = await drive(store, registry, clock)
    assert report.completed == 1
    final = await row_of(store, run.id)
    assert (final.status, final.cursor, final.lease_takeovers) == ("done", '"end"', 0)
    assert job.calls == ["a", "b", "b"]


async def test_a_read_only_database_is_a_clear_store_error_and_changes_nothing(
    sqlite_url: str, clock: FakeClock
) -> None:
    path = _path_of(sqlite_url)
    job = TwoSteps()
    registry = job.registry()
    writable = create_async_engine(sqlite_url)
    try:
        store = jobrun.SqlJobRunStore(writable)
        failing = jobrun.JobRegistry()
        failing.register(MODULE, JOB, _fail_after_a, retry=IMMEDIATE)
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        await drive(store, failing, clock)
        other = await jobrun.start_job_run(store, module_id=MODULE, job="other", clock=clock)
    finally:
        await writable.dispose()
    before = _dump(path)

    read_only = create_async_engine(f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true")
    try:
        store = jobrun.SqlJobRunStore(read_only)
        record = await jobrun.get_job_run(store, run.id)
        assert record is not None
        assert record.attempts == 1
        assert set(await store.steps(run.id)) == {"a"}
        attempts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("start_or_join", lambda: jobrun.start_job_run(store, module_id="m", job="j")),
            ("claim", lambda: drive(store, registry, clock)),
            ("cancel", lambda: jobrun.cancel_job_run(store, other.id, "stop", clock=clock)),
            ("release", lambda: jobrun.release_job_lease(store, run.id)),
        ]
        for operation, attempt in attempts:
            with pytest.raises(jobrun.StoreError) as caught:
                await attempt()
            assert caught.value.operation == operation
            assert "readonly" in str(caught.value), str(caught.value)
    finally:
        await read_only.dispose()
    assert _dump(path) == before
    assert job.calls == []


def _fail_after_a(p: jobrun.JobPass) -> Any:
    async def body() -> None:
        await p.step("a", lambda: 1)
        raise RuntimeError("later")

    return body()


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


# --- a handler that hangs ------------------------------------------------------------------


async def test_a_hanging_step_times_out_as_a_failed_pass_and_is_not_wedged(
    store: Any, clock: FakeClock
) -> None:
    calls: list[str] = []
    hang = {"on": True}
    hung = asyncio.Event()

    async def slow() -> str:
        calls.append("slow")
        if hang["on"]:
            hung.set()
            await asyncio.Event().wait()
        return "S"

    async def drive_past_the_budget() -> jobrun.JobDriveReport:
        # The budget runs on the drive's clock: once the step hangs, move it past.
        hung.clear()
        driving = asyncio.create_task(drive(store, registry, clock, pass_timeout_s=0.1))
        await asyncio.wait_for(hung.wait(), 10)
        clock.advance(milliseconds=100)
        return await asyncio.wait_for(driving, 10)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("first", lambda: calls.append("first"))
        await p.step("slow", slow)
        return jobrun.PassResult(cursor="through", done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE, lease_ms=SHORT_LEASE_MS)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)

    report = await drive_past_the_budget()
    assert (report.retrying, report.superseded) == (1, 0)
    row = await row_of(store, run.id)
    assert (row.status, row.attempts, row.cursor, row.lease_owner) == ("running", 1, None, None)
    assert row.last_error is not None
    assert "0.1" in row.last_error
    # The cut-off step left no record; the one before it did.
    assert set(await store.steps(run.id)) == {"first"}

    # Due again at once: a second hang fails again, it does not wedge the run.
    report = await drive_past_the_budget()
    assert report.retrying == 1
    assert (await row_of(store, run.id)).attempts == 2

    hang["on"] = False
    report = await drive(store, registry, clock, pass_timeout_s=0.1)
    assert report.completed == 1
    assert calls == ["first", "slow", "slow", "slow"]
    final = await row_of(store, run.id)
    assert (final.status, final.attempts, final.last_error) == ("done", 0, None)


# --- interruption: Ctrl-C, cancellation, a cancelled drive --------------------------------


# A KeyboardInterrupt or CancelledError raised by the handler's own code is a failed
# attempt, not an interruption: see test_poison.py.
INTERRUPTIONS = [
    pytest.param("task", asyncio.CancelledError, id="task-cancelled"),
]


@pytest.mark.parametrize(("where", "interruption"), INTERRUPTIONS)
async def test_an_interrupted_pass_hands_its_lease_back_and_resumes_without_repeats(
    store: Any, clock: FakeClock, where: str, interruption: type[BaseException]
) -> None:
    calls: list[str] = []
    in_b = asyncio.Event()
    interrupted = {"done": False}

    async def b() -> str:
        calls.append("b")
        if not interrupted["done"]:
            interrupted["done"] = True
            if where == "step":
                raise interruption()
            if where == "task":
                in_b.set()
                await asyncio.Event().wait()
        return "B"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("passes")
        await p.step("a", lambda: calls.append("a") or "A")
        if where == "handler" and not interrupted["done"]:
            interrupted["done"] = True
            raise interruption()
        await p.step("b", b)
        return jobrun.PassResult(cursor=p.cursor + 1, done=p.cursor + 1 >= 2)

    registry = jobrun.JobRegistry()
    # A long lease: only the hand-back can make the run due again at once.
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, payload=0, clock=clock)
    first = jobrun.JobRegistry()
    first.register(MODULE, JOB, lambda p: jobrun.PassResult(cursor=0))
    await drive(store, first, clock)
    before = await row_of(store, run.id)
    clock.advance(seconds=1)

    if where == "task":
        task = asyncio.create_task(drive(store, registry, clock, driver_name="one"))
        await asyncio.wait_for(in_b.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(interruption):
            await drive(store, registry, clock, driver_name="one")

    row = await row_of(store, run.id)
    # Only the claim's epoch moved (it never goes back): the hand-back kept it.
    assert row == replace(before, lease_epoch=before.lease_epoch + 1), (
        "the interrupted pass wrote something besides its ledger"
    )
    assert (row.lease_owner, row.next_attempt_at, row.lease_takeovers) == (None, None, 0)
    assert await store.steps(run.id) == {"a": StepRow("a", '"A"', 1, None)}

    # Another driver takes the run at once (no clock advance) and goes on from the ledger.
    report = await drive(store, registry, clock, driver_name="two")
    assert (report.attempted, report.advanced) == (1, 1)
    assert calls == (["a", "b"] if where == "handler" else ["a", "b", "b"])
    row = await row_of(store, run.id)
    assert (row.cursor, row.counters, row.attempts, row.last_error) == (
        "1",
        '{"passes":1}',
        0,
        None,
    )


class SlowReplies:
    """A store whose replies arrive ``delay_s`` after the database acted: an interruption
    in that window finds the write done but its answer not yet back."""

    def __init__(self, inner: Any, operation: str, delay_s: float = 0.05) -> None:
        self._inner = inner
        self._operation = operation
        self._delay_s = delay_s
        self.acted = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != self._operation:
            return attribute

        async def slow(*args: Any) -> Any:
            result = await attribute(*args)
            self.acted.set()
            # sleep: the injected slowness after the store acted
            await asyncio.sleep(self._delay_s)
            return result

        return slow


async def test_a_drive_cancelled_while_its_claim_is_answered_hands_the_lease_back(
    store: Any, clock: FakeClock
) -> None:
    job = TwoSteps()
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    slow = SlowReplies(store, "claim")
    task = asyncio.create_task(drive(slow, job.registry(), clock))
    await asyncio.wait_for(slow.acted.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = await row_of(store, run.id)
    assert (row.lease_owner, row.next_attempt_at, row.attempts) == (None, None, 0)
    report = await drive(store, job.registry(), clock)
    assert report.completed == 1
    assert (await row_of(store, run.id)).lease_takeovers == 0


async def test_a_drive_cancelled_while_a_commit_is_answered_never_rolls_the_run_back(
    store: Any, clock: FakeClock
) -> None:
    calls: list[int] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = p.cursor or 0
        await p.step("work", lambda: calls.append(cursor))
        p.count("passes")
        return jobrun.PassResult(cursor=cursor + 1, done=cursor + 1 >= 3)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    slow = SlowReplies(store, "commit_pass")
    # Several passes in one call: the first commit hands the lease to the second pass.
    task = asyncio.create_task(drive(slow, registry, clock, max_passes=3))
    await asyncio.wait_for(slow.acted.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    row = await row_of(store, run.id)
    assert (row.cursor, row.counters) == ("1", '{"passes":1}'), "the commit was undone"
    assert await store.steps(run.id) == {}
    assert row.lease_owner is None, "the lease was not handed back"
    report = await drive(store, registry, clock, max_passes=3)
    assert report.completed == 1
    assert calls == [0, 1, 2], "a committed pass ran again"


class LateCommit:
    """A store whose commit, once its caller is interrupted, reaches the database only
    after the next fenced write on another connection: a statement sent but not yet
    run there when the drive was cancelled, as on a loaded server."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sent = asyncio.Event()
        self._pending: tuple[Any, ...] | None = None
        self.landed: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit_pass(self, *args: Any) -> Any:
        if self.landed:
            return await self._inner.commit_pass(*args)
        self._pending = args
        self.sent.set()
        await asyncio.Event().wait()  # its answer never comes back
        raise AssertionError("unreachable")

    async def patch(self, *args: Any) -> bool:
        applied = bool(await self._inner.patch(*args))
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.landed.append(bool(await self._inner.commit_pass(*pending)))
        return applied


def _three_passes(calls: list[int], **options: Any) -> jobrun.JobRegistry:
    """A job of three one-step passes whose bodies note their cursor in ``calls``."""

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = p.cursor or 0
        await p.step("work", lambda: calls.append(cursor))
        return jobrun.PassResult(cursor=cursor + 1, done=cursor + 1 >= 3)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE, **options)
    return registry


async def test_a_commit_landing_after_its_drive_was_cancelled_leaves_no_lease(
    store: Any, clock: FakeClock
) -> None:
    calls: list[int] = []
    registry = _three_passes(calls)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    late = LateCommit(store)
    # Several passes in one call: the commit hands its lease on, under a new token.
    task = asyncio.create_task(drive(late, registry, clock, max_passes=3))
    await asyncio.wait_for(late.sent.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The commit landed right after the first hand-back: between the two.
    assert len(late.landed) == 1
    row = await row_of(store, run.id)
    assert row.lease_owner is None, "the lease the late commit handed on is still held"
    report = await drive(store, registry, clock, max_passes=3)
    assert report.completed == 1
    assert calls == [0, 1, 2], "a finished step ran again"


class SilentFirstPatch:
    """A store whose first fenced write (a pass's failure record) is sent and never
    answers; the ones after it go through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sent = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def patch(self, *args: Any) -> bool:
        if self.sent.is_set():
            return bool(await self._inner.patch(*args))
        self.sent.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_drive_cancelled_while_a_failure_is_written_hands_the_lease_back(
    store: Any, clock: FakeClock
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("work", lambda: None)
        raise RuntimeError("upstream said no")

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    silent = SilentFirstPatch(store)
    task = asyncio.create_task(drive(silent, registry, clock))
    await asyncio.wait_for(silent.sent.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = await row_of(store, run.id)
    assert row.lease_owner is None, "the lease waits out its expiry"
    assert row.attempts == 0, "an interrupted pass was charged"
    # The unanswered failure record is owed; sent again, it misses (the lease is gone).
    assert len(store.owed_releases) == 1
    assert await store.owed_releases.settle(store) == 1
    assert (await row_of(store, run.id)).attempts == 0


class AmbiguousCommit:
    """A store whose first commit is applied but reported as a failure (the reply was lost)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.lost = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit_pass(self, *args: Any) -> bool:
        applied = await self._inner.commit_pass(*args)
        if not self.lost:
            self.lost = True
            raise jobrun.StoreError("commit_pass", ConnectionResetError("reply lost"))
        return bool(applied)


async def test_a_commit_applied_but_reported_failed_never_rolls_the_run_back(
    store: Any, clock: FakeClock
) -> None:
    calls: list[int] = []
    registry = _three_passes(calls, lease_ms=SHORT_LEASE_MS)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    flaky = AmbiguousCommit(store)
    report = await drive(flaky, registry, clock, max_passes=3)
    assert report.advanced + report.retrying + report.superseded == 1
    row = await row_of(store, run.id)
    assert row.cursor == "1", "the applied commit was overwritten by a failure record"
    assert await store.steps(run.id) == {}

    final = await finish(store, registry, clock, run.id)
    assert (final.status, final.cursor) == ("done", "3")
    assert calls == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_drives_cancelled_at_random_moments_never_lose_or_undo_work(
    store: Any, clock: FakeClock
) -> None:
    """Cancel the drive task after a random delay, over and over, until every run is done."""
    rng = random.Random(20260101)
    executions: collections.Counter[tuple[str, int, int]] = collections.Counter()
    returned: dict[tuple[str, int, int], set[int]] = collections.defaultdict(set)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        cursor = p.cursor or 0
        for index in range(4):
            key = (p.run.id, cursor, index)

            def body(key: tuple[str, int, int] = key) -> int:
                executions[key] += 1
                return executions[key]

            returned[key].add(await p.step(f"s{index}", body))
        p.count("passes")
        return jobrun.PassResult(cursor=cursor + 1, done=cursor + 1 >= 3)

    registry = jobrun.JobRegistry()
    registry.register(
        MODULE, JOB, handler, retry=IMMEDIATE, lease_ms=SHORT_LEASE_MS, max_takeovers=1000
    )
    runs = [
        (
            await jobrun.start_job_run(
                store, module_id=MODULE, job=JOB, instance=f"i{n}", clock=clock
            )
        )
        for n in range(6)
    ]
    highest = {run.id: -1 for run in runs}
    stats: collections.Counter[str] = collections.Counter()
    # The cancel lands within ``window`` s. A round that moved nothing (every step
    # body and cursor as before) doubles it, up to 1 s, so a loaded machine where a
    # claim alone outlasts 25 ms still gets on; a round that moved resets it.
    window, moved = 0.025, -1
    for _ in range(400):
        task = asyncio.create_task(drive(store, registry, clock, max_passes=3, limit=2))
        # sleep: a seeded random moment for the cancel to land
        await asyncio.sleep(rng.uniform(0, window))
        task.cancel()
        try:
            await task
            stats["finished"] += 1
        except asyncio.CancelledError:
            stats["cancelled"] += 1
        leaked = False
        live = 0
        for run in runs:
            row = await row_of(store, run.id)
            cursor = -1 if row.cursor is None else int(row.cursor)
            assert cursor >= highest[run.id], "a run went backwards"
            highest[run.id] = cursor
            if row.status == "running":
                live += 1
                await assert_whole(store, run.id, row.cursor)
                leaked = leaked or row.lease_owner is not None
            else:
                assert row.status == "done", row.last_error
        if leaked:
            stats["leases left"] += 1
            clock.advance(milliseconds=SHORT_LEASE_MS + 1)
        if not live:
            break
        progress = sum(executions.values()) + sum(highest.values())
        window = 0.025 if progress != moved else min(window * 2, 1.0)
        moved = progress
    print(f"random cancellations: {dict(stats)}")
    assert stats["leases left"] == 0, "an interruption left a lease to expire"
    for run in runs:
        row = await row_of(store, run.id)
        assert (row.status, row.cursor, row.counters) == ("done", "3", '{"passes":3}')
    # A step runs again only when it was cut off before its record was written.
    repeated = sum(count - 1 for count in executions.values())
    print(f"step bodies: {sum(executions.values())}, repeated: {repeated}")
    assert set(executions) == {(run.id, c, i) for run in runs for c in range(3) for i in range(4)}
    # Once a step's result was recorded, every later pass got that same result back.
    assert all(len(values) == 1 for values in returned.values())


# --- a full disk: a release it kept from being written is owed, not waited out ------------


class FullDisk:
    """While ``full``, every write the store sends fails as a full disk fails it."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "WITH")

    def __init__(self, log: StatementLog) -> None:
        self.full = False
        self.refused = 0
        log.before = self._before

    async def _before(self, operation: str, statement: str) -> None:
        if operation == "claim" and "SKIP LOCKED" in statement:
            # The Postgres claim: one UPDATE that writes only the runs it takes. These
            # tests fill the disk while no run is due, and a statement that changes no
            # row writes nothing, so a full disk lets it find nothing.
            return
        if self.full and statement.lstrip().upper().startswith(self.WRITES):
            self.refused += 1
            raise OSError(28, "database or disk is full")


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_failure_record_a_full_disk_refused_is_written_once_space_returns(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    store, log = logged_store(engine)
    disk = FullDisk(log)
    job = TwoSteps()
    registry = job.registry()
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)

    async def fill() -> None:
        disk.full = True

    job.before_b = fill
    # Step b's record fails, then so does the failure record that would release the lease.
    with pytest.raises(jobrun.StoreError):
        await drive(store, registry, clock)
    held = await row_of(store, run.id)
    assert held.lease_owner is not None
    assert held.next_attempt_at is not None
    assert len(store.owed_releases) == 1
    # Still full: the owed write fails again and is kept; the run is still leased.
    assert (await drive(store, registry, clock)).attempted == 0
    assert len(store.owed_releases) == 1

    disk.full = False
    assert await store.owed_releases.settle(store) == 1
    released = await row_of(store, run.id)
    # Released long before the lease would have expired (the clock never moved).
    assert (released.lease_owner, released.attempts, released.status) == (None, 1, "running")
    assert released.last_error is not None
    assert "database or disk is full" in released.last_error
    assert format_instant(clock.now()) < held.next_attempt_at, "the lease had not expired"
    report = await drive(store, registry, clock)
    assert report.completed == 1
    assert job.calls == ["a", "b", "b"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_a_hand_back_a_full_disk_refused_is_written_before_the_next_claim(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    store, log = logged_store(engine)
    disk = FullDisk(log)
    job = TwoSteps()
    registry = job.registry()
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    in_b = asyncio.Event()

    async def fill_and_hang() -> None:
        disk.full = True
        in_b.set()
        await asyncio.Event().wait()

    job.before_b = fill_and_hang
    task = asyncio.create_task(drive(store, registry, clock))
    await asyncio.wait_for(in_b.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    held = await row_of(store, run.id)
    assert held.lease_owner is not None, "the hand-back could not be written"
    assert len(store.owed_releases) == 1

    disk.full = False
    # The next drive sends the hand-back first, then claims the run: no lease waited out.
    report = await drive(store, registry, clock)
    assert report.completed == 1
    assert len(store.owed_releases) == 0
    final = await row_of(store, run.id)
    assert (final.status, final.attempts, final.lease_takeovers) == ("done", 0, 0)
    assert format_instant(clock.now()) < (held.next_attempt_at or ""), "still within the lease"
