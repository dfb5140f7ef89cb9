"""Postgres: the connections the store keeps on the host's engine (``jobrun.sql.executor``).

Each test builds its own engine on a fresh migrated database, configured the way
a host would (pool size, connect events, pre-ping), and watches the server side
through an admin connection of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun.testing import FakeClock
from tests.support import drive, logged_store, row_of

pytestmark = pytest.mark.postgres
# The backend the ``database_url`` fixture builds a database for.
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"])

MODULE = "kept"
JOB = "steps"
APP = "jobrun-kept-connections"
STEPS = 6


def host_engine(url: str, **options: Any) -> AsyncEngine:
    """The host's engine; its connections show up in pg_stat_activity under ``APP``."""
    return create_async_engine(
        url, connect_args={"server_settings": {"application_name": APP}}, **options
    )


def steps_registry(seen: list[str] | None = None) -> jobrun.JobRegistry:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for index in range(STEPS):
            await p.step(f"s{index}", lambda index=index: index)
            if seen is not None:
                seen.append(f"s{index}")
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler)
    return registry


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[Any]:
    connection = await asyncpg.connect(
        make_url(database_url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        yield connection
    finally:
        await connection.close()


async def app_backends(admin: Any) -> list[int]:
    """The server processes serving the host's engine (and jobrun's presence)."""
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = "
        "current_database()",
        APP,
    )
    return [row["pid"] for row in rows]


async def run_once(store: jobrun.SqlJobRunStore, clock: FakeClock, instance: str) -> str:
    run = await jobrun.start_job_run(
        store, module_id=MODULE, job=JOB, instance=instance, clock=clock
    )
    assert (await drive(store, steps_registry(), clock)).completed == 1
    return run.id


@ON_POSTGRES
async def test_each_step_is_one_statement_on_a_connection_the_store_keeps(
    database_url: str, clock: FakeClock
) -> None:
    """No pool check-out (and so no pre-ping) per statement: the pass's statements
    are the ones the hook sees, on a connection taken from the pool at most once."""
    engine = host_engine(database_url, pool_pre_ping=True)
    checkouts: list[Any] = []
    event.listen(engine.sync_engine, "checkout", lambda *args: checkouts.append(args[0]))
    try:
        store, log = logged_store(engine)
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        log.seen.clear()
        checkouts.clear()
        assert (await drive(store, steps_registry(), clock, limit=1)).completed == 1
        operations = [operation for operation, _, _ in log.seen]
        assert operations.count("record_step") == STEPS
        # + stranded scan, claim (one statement, which also knows the fresh run's ledger
        # is empty, so the pass does not read it), commit
        assert len(operations) == STEPS + 3, operations
        assert len(checkouts) <= 1, "the store went back to the pool between statements"
    finally:
        await engine.dispose()


async def test_the_host_connect_event_applies_to_the_store_connections(
    empty_postgres_url: str, clock: FakeClock
) -> None:
    """jobrun's tables live only in the schema the host's connect event puts first on
    the search path: every statement of a pass finds them there."""
    engine = create_async_engine(empty_postgres_url)

    @event.listens_for(engine.sync_engine, "connect", insert=True)
    def search_path(dbapi_connection: Any, _record: Any) -> None:
        # SQLAlchemy's recipe: in autocommit, so the pool's reset does not undo it.
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute("CREATE SCHEMA IF NOT EXISTS hosted")
        cursor.execute("SET search_path TO hosted")
        cursor.close()
        dbapi_connection.autocommit = False

    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        run_id = await run_once(store, clock, "a")
        assert (await row_of(store, run_id)).status == "done"
        async with engine.connect() as connection:
            found = await connection.exec_driver_sql(
                "SELECT to_regclass('public._substrat_job_runs'), "
                "(SELECT count(*) FROM hosted._substrat_job_runs)"
            )
            assert tuple(found.one()) == (None, 1)
    finally:
        await engine.dispose()


@ON_POSTGRES
async def test_a_transaction_a_host_event_left_open_does_not_hold_back_step_writes(
    database_url: str, admin: Any, clock: FakeClock
) -> None:
    """A checkout event that runs a statement without autocommit (a hand-made ping)
    leaves the driver in a transaction, which the pool rolls back at check-in: each
    step must still be visible to everyone when ``step`` returns."""
    engine = host_engine(database_url)

    @event.listens_for(engine.sync_engine, "checkout")
    def touch(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT 1")
        cursor.close()

    seen_by_others: list[int] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: "A")
        seen_by_others.append(
            await admin.fetchval(
                "SELECT count(*) FROM _substrat_job_steps WHERE run_id = $1", p.run.id
            )
        )
        return jobrun.PassResult(cursor=1)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler)
    try:
        store = jobrun.SqlJobRunStore(engine)
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        assert (await drive(store, registry, clock, max_passes=1)).advanced == 1
        assert seen_by_others == [1]
    finally:
        await engine.dispose()


async def settled(admin: Any, sql: str, *arguments: Any) -> Any:
    """``sql``'s answer once it is empty or zero, or after 10 s (an ended session
    leaves pg_stat_activity a moment after its socket closes)."""
    found = None
    for _ in range(200):
        found = await admin.fetchval(sql, *arguments)
        if not found:
            break
        await asyncio.sleep(0.05)  # polling the server, not timing anything
    return found


async def wait_until_gone(admin: Any, pids: list[int]) -> list[int]:
    """The listed server processes still alive after up to 10 s."""
    left: list[int] = await settled(
        admin,
        "SELECT array_agg(pid) FROM pg_stat_activity WHERE pid = ANY($1::int[])",
        pids,
    )
    return left or []


async def drive_side_by_side(store: jobrun.SqlJobRunStore, clock: FakeClock, runs: int) -> None:
    """``runs`` runs driven by as many drives at once, so the store opens several
    connections. Which drive takes which run is not fixed: one may take two and
    another none (a claim passes over the runs other claims hold), so what is
    checked is that every run got done."""
    ids = [
        (
            await jobrun.start_job_run(
                store, module_id=MODULE, job=JOB, instance=f"i{n}", clock=clock
            )
        ).id
        for n in range(runs)
    ]
    reports = await asyncio.gather(*(drive(store, steps_registry(), clock) for _ in range(runs)))
    assert sum(report.completed for report in reports) == runs
    assert [(await row_of(store, run_id)).status for run_id in ids] == ["done"] * runs


@ON_POSTGRES
async def test_disposing_the_engine_closes_the_store_connections(
    database_url: str, admin: Any, clock: FakeClock
) -> None:
    engine = host_engine(database_url, pool_size=3)
    store = jobrun.SqlJobRunStore(engine)
    try:
        await drive_side_by_side(store, clock, 3)
        before = await app_backends(admin)
        assert before, "no connection of the host's engine is open"
        await engine.dispose()
        assert await wait_until_gone(admin, before) == []
        # The store goes on after a dispose: it takes fresh connections from the pool.
        await run_once(store, clock, "after")
    finally:
        await engine.dispose()
    assert await wait_until_gone(admin, await app_backends(admin)) == []


@ON_POSTGRES
async def test_a_connection_the_server_ended_is_replaced_on_the_next_operation(
    database_url: str, admin: Any, clock: FakeClock
) -> None:
    engine = host_engine(database_url)
    store = jobrun.SqlJobRunStore(engine)
    try:
        await run_once(store, clock, "first")
        # Every connection of the host's engine but the presence (which holds an
        # advisory lock), waiting up to 5 s for each to end.
        ended = await admin.fetch(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = $1 AND datname = current_database() "
            "AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory')",
            APP,
        )
        assert ended
        assert all(row[0] for row in ended)
        run_id = await run_once(store, clock, "second")
        assert (await row_of(store, run_id)).status == "done"
    finally:
        await engine.dispose()


@ON_POSTGRES
async def test_more_runs_in_flight_than_the_pool_holds_take_turns(
    database_url: str, admin: Any, clock: FakeClock
) -> None:
    """Eight runs on a pool of two without overflow: operations wait for one of the
    store's connections rather than for the pool, and every run completes."""
    engine = host_engine(database_url, pool_size=2, max_overflow=0, pool_timeout=5)
    store = jobrun.SqlJobRunStore(engine)
    try:
        for index in range(8):
            await jobrun.start_job_run(
                store, module_id=MODULE, job=JOB, instance=f"i{index}", clock=clock
            )
        registry = steps_registry()
        reports = await asyncio.gather(*(drive(store, registry, clock, limit=1) for _ in range(8)))
        assert sum(report.completed for report in reports) == 8
        # Two from the pool, one for the presence (a pool of its own).
        assert len(await app_backends(admin)) <= 3
    finally:
        await engine.dispose()


@ON_POSTGRES
async def test_a_transaction_cancelled_mid_statement_leaves_nothing_open(
    database_url: str, admin: Any, clock: FakeClock
) -> None:
    engine = host_engine(database_url)
    store, log = logged_store(engine)
    sent = asyncio.Event()

    async def before(operation: str, sql: str) -> None:
        if operation == "resume" and not sql.startswith("BEGIN"):
            sent.set()

    try:
        run = await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        await jobrun.cancel_job_run(store, run.id, "stop", clock=clock)
        stopped = (await row_of(store, run.id)).status
        log.before = before
        locker = admin.transaction()
        await locker.start()
        # Hold the run row: the resume's update waits on it inside its transaction.
        await admin.execute("SELECT 1 FROM _substrat_job_runs WHERE id = $1 FOR UPDATE", run.id)
        task = asyncio.create_task(jobrun.resume_job_run(store, run.id, clock=clock))
        await asyncio.wait_for(sent.wait(), 10)
        task.cancel()
        await asyncio.sleep(0.1)  # the cancellation reaches the server first
        # Released before awaiting the task: a session blocked on the row might only
        # notice its closed socket once it gets the lock.
        await locker.rollback()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The cancelled resume's session is gone, with its transaction.
        busy = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'"
        )
        assert await settled(admin, busy, APP) == 0
        assert (await row_of(store, run.id)).status == stopped
        assert await jobrun.resume_job_run(store, run.id, clock=clock)
        assert (await drive(store, steps_registry(), clock)).completed == 1
    finally:
        await engine.dispose()


@ON_POSTGRES
async def test_the_host_gets_a_turn_on_a_full_pool_while_a_pass_runs(
    database_url: str, clock: FakeClock
) -> None:
    """A pool of one: the store keeps its connection between steps, but hands it back
    now and then while the pool has nothing left to give, so the host's own check-out
    succeeds long before its timeout and before the pass ends."""
    engine = host_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=5)
    stepping, host_done = asyncio.Event(), asyncio.Event()
    steps_before_host: list[int] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        index = 0
        # Steps until the host got its connection (bounded, in case it never does).
        while not host_done.is_set() and index < 20_000:
            await p.step(f"s{index}", lambda index=index: index)
            index += 1
            stepping.set()
        steps_before_host.append(index)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler)

    async def host() -> None:
        await asyncio.wait_for(stepping.wait(), 10)
        async with engine.connect() as connection:
            await connection.exec_driver_sql("SELECT 1")
        host_done.set()

    store = jobrun.SqlJobRunStore(engine)
    try:
        await jobrun.start_job_run(store, module_id=MODULE, job=JOB, clock=clock)
        passing = asyncio.create_task(drive(store, registry, clock))
        await host()
        assert (await passing).completed == 1
        assert steps_before_host[0] < 20_000
    finally:
        await engine.dispose()
