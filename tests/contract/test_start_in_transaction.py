"""Starting a run inside the caller's transaction (issue 34 item 2): ``connection=``.

The run exists if and only if the caller's transaction commits; on Postgres the
wake-up (NOTIFY) goes out at that commit; two open transactions starting one key
end with one live run. SQLite and Postgres (a memory store has no transaction).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import jobrun
from jobrun.testing import MemoryJobRunStore
from tests.contract.test_start import count_rows
from tests.support import JOB, MODULE_ID, SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
WAIT_S = 30.0  # bounds a hang only


async def test_a_start_in_a_rolled_back_transaction_leaves_no_run(store, engine):
    async with engine.connect() as connection:
        transaction = await connection.begin()
        run = await jobrun.start_job_run(
            store, module_id=MODULE_ID, job=JOB, payload={"a": 1}, connection=connection
        )
        assert run.joined is False
        await transaction.rollback()

    assert await jobrun.get_job_run(store, run.id) is None
    assert await count_rows(engine) == 0


async def test_a_start_in_a_committed_transaction_is_a_run_with_the_callers_rows(store, engine):
    async with engine.begin() as connection:
        await connection.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        await connection.exec_driver_sql("INSERT INTO orders (id) VALUES (7)")
        runs = await jobrun.start_job_runs(
            store,
            [jobrun.JobStart(module_id=MODULE_ID, job=JOB, instance=f"order-{n}") for n in (7, 8)],
            connection=connection,
        )

    for run in runs:
        assert await jobrun.get_job_run(store, run.id) == run
    assert await count_rows(engine, live_only=True) == 2


async def test_an_orm_session_connection_starts_with_the_session(store, engine):
    async with AsyncSession(engine) as session:
        async with session.begin():
            run = await jobrun.start_job_run(
                store, module_id=MODULE_ID, job=JOB, connection=await session.connection()
            )
        async with session.begin():
            dropped = await jobrun.start_job_run(
                store,
                module_id=MODULE_ID,
                job=JOB,
                instance="dropped",
                connection=await session.connection(),
            )
            await session.rollback()

    assert await jobrun.get_job_run(store, run.id) == run
    assert await jobrun.get_job_run(store, dropped.id) is None


async def test_a_connection_not_in_a_transaction_is_refused(store, engine):
    async with engine.connect() as connection:
        with pytest.raises(jobrun.JobValidationError, match="connection is not in a transaction"):
            await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, connection=connection)
    assert await count_rows(engine) == 0


async def test_a_connection_of_another_database_is_refused(store, engine, tmp_path):
    other = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'other.db'}")
    try:
        async with other.begin() as connection:
            with pytest.raises(jobrun.JobValidationError, match="not of the store's database"):
                await jobrun.start_job_run(
                    store, module_id=MODULE_ID, job=JOB, connection=connection
                )
    finally:
        await other.dispose()
    assert await count_rows(engine) == 0


async def test_what_is_not_a_connection_is_refused(store, engine):
    with pytest.raises(jobrun.ArgumentTypeError, match="must be a SQLAlchemy AsyncConnection"):
        await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, connection=engine)


async def test_a_memory_store_refuses_a_connection(engine):
    async with engine.begin() as connection:
        with pytest.raises(jobrun.JobValidationError, match="connection= is for a SqlJobRunStore"):
            await jobrun.start_job_run(
                MemoryJobRunStore(), module_id=MODULE_ID, job=JOB, connection=connection
            )


async def _start_in(engine: AsyncEngine, store: Any, began: asyncio.Event, finish: Any) -> Any:
    """Start the key in a transaction of its own, then end it as ``finish`` says."""
    async with engine.connect() as connection:
        transaction = await connection.begin()
        began.set()
        run = await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, connection=connection)
        await finish(transaction)
        return run


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
async def test_two_open_transactions_starting_one_key_end_with_one_live_run(
    store, engine, first_ends
):
    """The second caller's insert waits for the first transaction: after a commit it
    joins that run; after a rollback it makes its own."""
    async with engine.connect() as first:
        first_transaction = await first.begin()
        made = await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, connection=first)
        began = asyncio.Event()
        second = asyncio.create_task(_start_in(engine, store, began, lambda t: t.commit()))
        await asyncio.wait_for(began.wait(), WAIT_S)
        if engine.dialect.name == "postgresql":
            # The second's insert waits on the first's uncommitted row (as the docs say).
            await asyncio.wait_for(_a_start_waits_on_a_lock(engine), WAIT_S)
        # (SQLite: the second waits for the write lock if it got that far; either way
        # ending the first frees it.)
        end = first_transaction.commit if first_ends == "commit" else first_transaction.rollback
        await end()
    joined = await asyncio.wait_for(second, WAIT_S)

    assert joined.joined is (first_ends == "commit")
    assert (joined.id == made.id) is (first_ends == "commit")
    assert await count_rows(engine, live_only=True) == 1
    assert [run.id for run in await jobrun.job_runs(store, status="running")] == [joined.id]


async def _a_start_waits_on_a_lock(engine: AsyncEngine) -> None:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO _substrat_job_runs%'"
    )
    async with engine.connect() as connection:
        while True:
            if (await connection.exec_driver_sql(query)).scalar_one():
                return
            await asyncio.sleep(0.01)  # a poll interval; the caller's deadline bounds a hang


@pytest.fixture
async def notified(engine: AsyncEngine) -> AsyncIterator[list[str]]:
    payloads: list[str] = []
    if engine.dialect.name != "postgresql":
        pytest.skip("NOTIFY is Postgres's; SQLite's workers are woken by the file's writes")
    async with engine.connect() as connection:
        raw = (await connection.get_raw_connection()).driver_connection
        assert raw is not None
        await raw.add_listener("jobrun_started", lambda *args: payloads.append(args[3]))
        yield payloads


async def _arrived(payloads: list[str], payload: str) -> None:
    async def wait() -> None:
        while True:
            if payload in payloads:
                return
            await asyncio.sleep(0.01)  # a poll interval; WAIT_S bounds a hang

    await asyncio.wait_for(wait(), WAIT_S)


async def test_the_wake_up_goes_out_at_commit_and_never_for_a_rollback(store, engine, notified):
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await jobrun.start_job_run(store, module_id="a", job="rolled", connection=connection)
        await transaction.rollback()
    async with engine.begin() as connection:
        await jobrun.start_job_run(store, module_id="a", job="kept", connection=connection)
    await _arrived(notified, '["a", "kept"]')

    # Notifications arrive in commit order: the rolled-back one would have come first.
    assert notified == ['["a", "kept"]']


async def test_a_batch_wakes_once_per_job(store, notified):
    starts = [
        jobrun.JobStart(module_id="a", job=job, instance=str(n))
        for n in range(20)
        for job in ("one", "two")
    ]
    await jobrun.start_job_runs(store, starts)
    await jobrun.start_job_runs(store, starts)  # every key joined: no wake-up
    await jobrun.start_job_run(store, module_id="a", job="last")
    await _arrived(notified, '["a", "last"]')

    assert sorted(notified[:2]) == ['["a", "one"]', '["a", "two"]']
    assert notified[2:] == ['["a", "last"]']


async def test_concurrent_single_starts_each_wake_their_job(store, notified):
    """Concurrent single starts go out in batches, one NOTIFY per job in each batch's
    statement: every job started gets its wake-up, and only one."""
    jobs = [f"job-{n}" for n in range(16)]
    await asyncio.gather(*(jobrun.start_job_run(store, module_id="a", job=job) for job in jobs))
    for job in jobs:
        await _arrived(notified, f'["a", "{job}"]')
    assert sorted(notified) == sorted(f'["a", "{job}"]' for job in jobs)
