"""The SQL store's one execution path: its statement hook, its transactions under
faults and cancellation, and the host's engine configuration.

Every test here runs the store exactly as users build it (``statement_hook`` is
a constructor option, not a different path).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import pytest
from sqlalchemy import event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._core.model.records import ClaimRequest, RunFilter, StepRow
from jobrun._core.operator.browse import RunQuery
from jobrun._core.rules.transitions import cancel_transition, release_transition, resume_transition
from jobrun.sql.executor import _sqlite_connection_of
from jobrun.testing import FakeClock
from tests.support import SQL_BACKENDS, drive, logged_store, row_of

MODULE = "executor"
JOB = "walk"
IMMEDIATE = jobrun.RetryPolicy(max_attempts=50, base_delay_ms=0)


class Injected(Exception):
    """The fault a hook raises on purpose."""


def two_steps() -> jobrun.JobRegistry:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: "A")
        await p.step("b", lambda: "B")
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    return registry


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_the_hook_sees_every_statement_of_a_pass(
    engine: AsyncEngine, backend: str, clock: FakeClock
) -> None:
    store, log = logged_store(engine)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    log.seen.clear()
    assert (await drive(store, two_steps(), clock, limit=1)).advanced == 1
    operations = [operation for operation, _, _ in log.seen]
    commit = ["commit_pass"] if backend == "postgres" else ["commit_pass"] * 4
    # The driver's first claim on a store begins with the scan for runs stranded by a
    # dead holder (jobrun._core.leases.proof_of_death; then at most once a second). On SQLite the
    # claim reads its run, then writes the core's decision fenced on what it read, and
    # the pass reads the ledger; on Postgres the claim is one statement that also
    # knows the fresh run's ledger is empty, so the pass does not read it.
    claim = ["UPDATE"] if backend == "postgres" else ["SELECT", "UPDATE"]
    ledger = [] if backend == "postgres" else ["steps"]
    assert operations == [
        "held_leases",
        *["claim"] * len(claim),
        *ledger,
        "record_step",
        "record_step",
        *commit,
    ]
    kinds = [sql.split()[0] for operation, sql, _ in log.seen if operation == "claim"]
    assert kinds == claim
    if backend == "sqlite":
        # BEGIN, the fenced write, the ledger drop, COMMIT: one transaction.
        kinds = [sql.split()[0] for operation, sql, _ in log.seen if operation == "commit_pass"]
        assert kinds == ["BEGIN", "UPDATE", "DELETE", "COMMIT"]
    steps = [parameters for operation, _, parameters in log.seen if operation == "record_step"]
    assert [[value for value in parameters if value in ("a", "b")] for parameters in steps] == [
        ["a"],
        ["b"],
    ]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("where", ["after-write", "before-last"])
async def test_a_pass_commit_interrupted_inside_moves_cursor_and_ledger_together(
    engine: AsyncEngine, backend: str, clock: FakeClock, where: str
) -> None:
    """A fault after the commit's fenced write, or before its last statement: the cursor
    and the ledger drop are one transaction, so both happened or neither did."""
    store, log = logged_store(engine)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    commit_statements: list[str] = []
    raised: list[str] = []

    async def before(operation: str, sql: str) -> None:
        if operation == "commit_pass":
            commit_statements.append(sql)
            if where == "before-last" and sql.startswith(("COMMIT", "WITH")):
                raised.append(sql)
                raise Injected(sql)

    async def after(operation: str, sql: str) -> None:
        if (
            where == "after-write"
            and operation == "commit_pass"
            and sql.startswith(("UPDATE", "WITH"))
            and not raised
        ):
            raised.append(sql)
            raise Injected(sql)

    log.before, log.after = before, after
    # The pass engine may record the failed commit as a failed pass, or let it escape.
    with contextlib.suppress(Injected, jobrun.StoreError):
        await drive(store, two_steps(), clock, limit=1)
    log.before = log.after = None
    assert len(raised) == 1
    row = await row_of(store, run.id)
    ledger = await store.steps(run.id)
    if backend == "postgres" and where == "after-write":
        # One statement: it was committed whole before the hook saw it end.
        assert (row.cursor, ledger) == ("1", {})
    else:
        assert row.cursor is None
        assert sorted(ledger) == ["a", "b"], "the cursor stayed but the ledger went"
    if backend == "sqlite":
        # Nothing left open: another connection takes the write lock at once.
        assert_write_lock_free(engine)


def assert_write_lock_free(engine: AsyncEngine) -> None:
    database = make_url(str(engine.url)).database
    assert database is not None
    other = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


async def test_sqlite_a_transaction_cancelled_mid_statement_is_rolled_back(
    sqlite_url: str, clock: FakeClock
) -> None:
    engine = create_async_engine(sqlite_url)
    database = make_url(sqlite_url).database
    assert database is not None
    try:
        store, log = logged_store(engine, sqlite_busy_timeout_ms=10_000)
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        await drive(store, two_steps(), clock, max_passes=1)
        holder = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
        sent = asyncio.Event()

        async def before(operation: str, sql: str) -> None:
            if operation == "resume" and sql.startswith("BEGIN"):
                sent.set()

        log.before = before
        await jobrun.cancel_job_run(store, run.id, "stop", clock=clock)
        holder.execute("BEGIN IMMEDIATE")
        # The store's BEGIN IMMEDIATE now waits in aiosqlite's thread for the lock.
        task = asyncio.create_task(jobrun.resume_job_run(store, run.id, clock=clock))
        await asyncio.wait_for(sent.wait(), 10)
        # asyncio.sleep: most likely puts the cancel mid-wait (SQLite cannot show a waiter),
        # but the outcome asserted below is the same whenever the cancel lands.
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        holder.execute("ROLLBACK")
        holder.close()
        # The cancelled transaction's connection is given up (its thread may never come
        # back, issue 31): the rollback queued on it runs once the thread is free, then
        # it closes; the next operation goes on a fresh connection.
        ((_connection, driver, rollback),) = _sqlite_connection_of(engine).abandoned
        assert rollback is not None
        await asyncio.wait_for(asyncio.shield(rollback), 10)
        # Its thread ends after the close, whose answer needs this loop.
        await asyncio.to_thread(driver._thread.join, 10)
        assert (await row_of(store, run.id)).status == "failed"
        assert [sql.split()[0] for op, sql, _ in log.seen if op == "resume"][-1] == "ROLLBACK"
        assert_write_lock_free(engine)
        assert await jobrun.resume_job_run(store, run.id, clock=clock)
    finally:
        await engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"])
async def test_postgres_a_step_write_cancelled_mid_statement_leaves_nothing_open(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    store, log = logged_store(engine)
    run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    dsn = make_url(str(engine.url)).set(drivername="postgresql").render_as_string(False)
    admin = await asyncpg.connect(dsn)
    sent = asyncio.Event()
    locker = admin.transaction()

    async def before(operation: str, _sql: str) -> None:
        if operation == "record_step" and not sent.is_set():
            # Hold the run row: the step write's fence (FOR SHARE) waits on it.
            await locker.start()
            await admin.execute("SELECT 1 FROM _substrat_job_runs WHERE id = $1 FOR UPDATE", run.id)
            sent.set()

    log.before = before

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: "A")
        return jobrun.PassResult(cursor=1)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    try:
        task = asyncio.create_task(drive(store, registry, clock))
        await asyncio.wait_for(sent.wait(), 10)
        # The step write is mid-statement once the server shows it waiting on the lock.
        await until_lock_waiters(admin, present=True)
        task.cancel()
        # And the cancel has reached the server once it waits no more.
        await until_lock_waiters(admin, present=False)
        # Released before awaiting the task: its lease hand-back needs the row too.
        await locker.rollback()
        with pytest.raises(asyncio.CancelledError):
            await task
        open_transactions = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
        )
        assert open_transactions == 0
        assert await store.steps(run.id) == {}, "the cancelled step write was applied"
    finally:
        await admin.close()
    # The pool hands out healthy connections; the run goes on.
    assert (await row_of(store, run.id)).lease_owner is None
    assert (await drive(store, registry, clock)).advanced == 1


async def until_lock_waiters(admin: Any, *, present: bool) -> None:
    """Poll until some statement does (or none does) wait on a row lock; 60 s bounds a hang."""
    deadline = time.monotonic() + 60
    while True:
        waiting = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        if (waiting > 0) == present:
            return
        assert time.monotonic() < deadline, f"lock waiters present={not present} for 60 s"
        await asyncio.sleep(0.01)  # a poll interval, not a wait for the event


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_the_host_engine_configuration_applies_to_the_store(
    engine: AsyncEngine, clock: FakeClock
) -> None:
    """The store takes its connections from the host's pool: the host's events run."""
    checkouts: list[Any] = []
    event.listen(engine.sync_engine, "checkout", lambda *args: checkouts.append(args[0]))
    store = jobrun.SqlJobRunStore(engine)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    assert (await drive(store, two_steps(), clock)).advanced == 1
    assert checkouts, "the store bypassed the host's pool"


async def test_disposing_the_engine_closes_the_store_connection(
    sqlite_url: str, tmp_path: Path, clock: FakeClock
) -> None:
    engine = create_async_engine(sqlite_url)
    store = jobrun.SqlJobRunStore(engine)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    await engine.dispose()
    # After dispose the store opens a fresh connection on first use.
    assert len(await jobrun.job_runs(store)) == 1
    await engine.dispose()


async def test_sqlite_a_new_step_is_one_call_into_the_driver_thread(
    sqlite_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a hook (the path users run by default) a new step costs one hop to
    aiosqlite's thread: the statement executes there and its change count comes back."""
    engine = create_async_engine(sqlite_url)
    hops: list[Any] = []
    queued = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await queued(self, fn, *args, **kwargs)

    # aiosqlite's one way into its thread: every driver call goes through it.
    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    per_step: list[int] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in ("a", "b", "c"):
            before = len(hops)
            assert await p.step(name, lambda name=name: name.upper()) == name.upper()
            per_step.append(len(hops) - before)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    try:
        store = jobrun.SqlJobRunStore(engine)
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        assert (await drive(store, registry, clock)).completed == 1
        # The first step also reads the pass's ledger (once per pass); then one hop each.
        assert per_step == [2, 1, 1]
        assert (await row_of(store, run.id)).status == "done"
    finally:
        await engine.dispose()


async def test_sqlite_a_step_write_cancelled_mid_statement_leaves_nothing_open(
    sqlite_url: str, clock: FakeClock
) -> None:
    """The hookless step write, cancelled while it waits for the write lock: a lone
    statement in autocommit, so whatever it did is committed or undone by SQLite and
    no transaction stays open. Its connection is given up (issue 31: its thread may
    never come back); the next operation goes on a fresh one."""
    engine = create_async_engine(sqlite_url)
    database = make_url(sqlite_url).database
    assert database is not None
    holder = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    started = asyncio.Event()

    def body() -> str:
        # Take the write lock so that the step's write waits in aiosqlite's thread.
        holder.execute("BEGIN IMMEDIATE")
        started.set()
        return "A"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", body)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    try:
        store = jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=10_000)
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        task = asyncio.create_task(drive(store, registry, clock))
        await asyncio.wait_for(started.wait(), 10)
        # Long enough for the write to be queued and waiting on the lock: no event
        # marks that moment without a hook, and a hook would change the path.
        await asyncio.sleep(0.05)
        task.cancel()
        holder.execute("ROLLBACK")
        with pytest.raises(asyncio.CancelledError):
            await task
        for _connection, driver, _then in _sqlite_connection_of(engine).abandoned:
            # The given-up connection's thread ends after its close, whose answer needs
            # this loop.
            await asyncio.to_thread(driver._thread.join, 10)
        # Whether the write landed or not, nothing is left open on the store's connection.
        ledger = await store.steps(run.id)
        assert set(ledger) <= {"a"}
        assert_write_lock_free(engine)
        assert (await row_of(store, run.id)).status == "running"
    finally:
        holder.close()
        await engine.dispose()


class _RefusingHook:
    """A statement hook that records the operation, then fails as a lost connection would."""

    def __init__(self) -> None:
        self.operations: list[str] = []

    @contextlib.asynccontextmanager
    async def __call__(self, operation: str, sql: str, parameters: Any) -> AsyncIterator[None]:
        self.operations.append(operation)
        raise OSError("connection lost (injected)")
        yield  # pragma: no cover - never reached: an async generator needs a yield


_NOW = "2026-01-01T00:00:00.000Z"


_LATER = "2026-01-01T00:01:00.000Z"


_CLAIM = ClaimRequest(_NOW, "T", "d", {("m", "j"): _LATER})


# By the operation the hook and the error must name: a call to the store that sends it.
STORE_OPERATIONS: dict[str, tuple[str, Any]] = {
    "get": ("get", lambda store: store.get("R")),
    "claim": ("claim", lambda store: store.claim(_CLAIM)),
    # Postgres orders a limited job's claims with a lock, in a transaction of its own.
    "claim-limited": (
        "claim",
        lambda store: store.claim(replace(_CLAIM, max_concurrent={("m", "j"): 1})),
    ),
    "held_leases": ("held_leases", lambda store: store.held_leases(_NOW, None)),
    "list": ("list", lambda store: store.list(RunFilter())),
    "steps": ("steps", lambda store: store.steps("R")),
    "record_step": (
        "record_step",
        lambda store: store.record_step("R", StepRow("s", "1", 1, None), _NOW, "T"),
    ),
    "extend_lease": ("extend_lease", lambda store: store.extend_lease("R", "T", _LATER, _LATER)),
    "cancel": ("cancel", lambda store: store.cancel("R", cancel_transition("why", _NOW))),
    "resume": ("resume", lambda store: store.resume("R", resume_transition(_NOW))),
    "release": ("release", lambda store: store.release("R", release_transition())),
    "health": ("health", lambda store: store.health(_NOW)),
    "due_by_job": ("due_by_job", lambda store: store.due_by_job(_NOW)),
    "prune": ("prune", lambda store: store.prune(_NOW, ("done",), 10)),
    "schedule_rows": ("schedule_rows", lambda store: store.schedule_rows()),
    "find": ("find", lambda store: store.find(RunQuery())),
    "count": ("count", lambda store: store.count(RunQuery(), 10)),
    "job_loads": ("job_loads", lambda store: store.job_loads(_NOW, _NOW)),
}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("call", sorted(STORE_OPERATIONS))
async def test_a_failed_store_operation_is_named_to_the_hook_and_in_the_error(
    engine: AsyncEngine, backend: str, call: str
) -> None:
    operation, send = STORE_OPERATIONS[call]
    hook = _RefusingHook()
    store = jobrun.SqlJobRunStore(engine, statement_hook=hook)
    with pytest.raises(jobrun.StoreError) as caught:
        await send(store)
    assert caught.value.operation == operation
    assert str(caught.value) == f"{operation} failed: OSError: connection lost (injected)"
    # A transaction's failed BEGIN is followed by its ROLLBACK, under the same name.
    assert hook.operations[0] == operation
    assert set(hook.operations) == {operation}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_the_step_write_binds_its_seven_values_in_the_order_the_store_passes_them(
    engine: AsyncEngine, backend: str, clock: FakeClock
) -> None:
    """The step's path builds its parameter list directly (no mapping): the statement
    takes exactly those values, the constants written into its text."""
    store, log = logged_store(engine)
    await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
    log.seen.clear()
    # No run is held by "T": the fenced write applies nowhere and says so.
    assert not await store.record_step("R", StepRow("s", '{"a":1}', 2, "e"), _NOW, "T")
    [(operation, sql, parameters)] = log.seen
    assert operation == "record_step"
    assert list(parameters) == ["s", '{"a":1}', 2, "e", _NOW, "R", "T"]
    assert "'running'" in sql
    prepared = store._statements.record_step
    with pytest.raises(TypeError, match="expected the parameters"):
        prepared.in_order(("fence_id", "fence_token"))
