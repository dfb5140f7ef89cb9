"""A store on a plain SQLite engine sets the connection up itself.

WAL (readers beside the writer) and a busy timeout (writers in other processes
wait instead of failing with "database is locked"), on every connection the
store uses, including one the host's pool opened before the store existed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

import jobrun
from jobrun.sql.executor import _sqlite_connections

BUSY_TIMEOUT_MS = 4321  # distinct from the driver's default (5000) and jobrun's (30000)
KEY = {"module_id": "@test/jobs", "job": "walk"}

# Another process takes SQLite's write lock, says so, holds it, then commits.
HOLD_LOCK = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
connection.close()
"""


async def _pragma(connection: AsyncConnection, name: str) -> object:
    return (await connection.exec_driver_sql(f"PRAGMA {name}")).scalar_one()


async def _driver_connection(connection: AsyncConnection) -> object:
    return (await connection.get_raw_connection()).driver_connection


async def test_store_turns_on_wal_and_busy_timeout_even_on_an_older_pooled_connection(
    sqlite_url: str,
) -> None:
    engine = create_async_engine(sqlite_url, pool_size=1, max_overflow=0)
    try:
        # The host uses the engine first; the pool keeps that connection.
        async with engine.connect() as connection:
            opened_before = await _driver_connection(connection)
            assert await _pragma(connection, "journal_mode") == "delete"
            assert await _pragma(connection, "busy_timeout") != BUSY_TIMEOUT_MS

        store = jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS)
        run = await jobrun.start_job_run(store, **KEY)
        assert run.status == "running"
        # The store took the pooled connection for its own (out of the pool's count).
        assert _sqlite_connections[engine.sync_engine].driver is opened_before

        async with engine.connect() as connection:
            assert await _pragma(connection, "journal_mode") == "wal"
            assert await _pragma(connection, "busy_timeout") == BUSY_TIMEOUT_MS
            assert await _pragma(connection, "synchronous") == 1  # NORMAL
    finally:
        await engine.dispose()


async def test_every_new_connection_is_set_up_too(sqlite_url: str) -> None:
    engine = create_async_engine(sqlite_url, pool_size=3, max_overflow=0)
    try:
        jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS)
        async with engine.connect() as one, engine.connect() as two, engine.connect() as three:
            connections = [one, two, three]
            assert len({id(await _driver_connection(c)) for c in connections}) == 3
            for connection in connections:
                assert await _pragma(connection, "journal_mode") == "wal"
                assert await _pragma(connection, "busy_timeout") == BUSY_TIMEOUT_MS
    finally:
        await engine.dispose()


async def _start_while_another_process_holds_the_lock(
    sqlite_url: str, busy_timeout_ms: int, hold_seconds: float
) -> float:
    """Start a run while another process holds the write lock; return how long it took."""
    path = make_url(sqlite_url).database
    assert path is not None
    engine = create_async_engine(sqlite_url)
    try:
        store = jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=busy_timeout_ms)
        # Set up (WAL, schema check) before the other process arrives.
        assert await jobrun.get_job_run(store, "0" * 26) is None
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLD_LOCK,
            path,
            str(hold_seconds),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), timeout=30)
            assert line == b"locked\n"
            began = time.monotonic()
            try:
                await jobrun.start_job_run(store, **KEY)
            finally:
                waited = time.monotonic() - began
        finally:
            assert await asyncio.wait_for(holder.wait(), timeout=30) == 0
        return waited
    finally:
        await engine.dispose()


async def test_a_writer_in_another_process_makes_jobrun_wait_not_fail(sqlite_url: str) -> None:
    hold = 0.5
    waited = await _start_while_another_process_holds_the_lock(sqlite_url, 10_000, hold)
    # It did meet the lock (so it waited), and got through once the lock was let go.
    assert waited >= hold / 2
    assert waited < 10
    engine = create_async_engine(sqlite_url)
    try:
        runs = await jobrun.job_runs(jobrun.SqlJobRunStore(engine), **KEY)
        assert len(runs) == 1
    finally:
        await engine.dispose()


async def test_the_configured_timeout_is_the_one_that_applies(sqlite_url: str) -> None:
    # The same lock with a timeout far shorter than the hold: the store gives up.
    with pytest.raises(jobrun.StoreError, match="database is locked"):
        await _start_while_another_process_holds_the_lock(sqlite_url, 50, hold_seconds=1.0)


async def test_a_read_only_file_not_in_wal_mode_can_still_be_read(tmp_path: Path) -> None:
    """Switching to WAL needs a write; on a read-only file jobrun skips it and reads."""
    path = tmp_path / "rollback-journal.db"
    writer = create_async_engine(f"sqlite+aiosqlite:///{path}")
    await jobrun.upgrade(writer)
    run = await jobrun.start_job_run(jobrun.SqlJobRunStore(writer), module_id="m", job="j")
    await writer.dispose()
    plain = sqlite3.connect(path)
    plain.execute("PRAGMA journal_mode = DELETE")
    plain.close()

    reader = create_async_engine(f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true")
    try:
        store = jobrun.SqlJobRunStore(reader)
        assert [record.id for record in await jobrun.job_runs(store)] == [run.id]
        with pytest.raises(jobrun.StoreError, match="readonly"):
            await jobrun.start_job_run(store, module_id="m", job="other")
    finally:
        await reader.dispose()


async def test_an_in_memory_database_works_end_to_end() -> None:
    # The store's connection is made by aiosqlite's thread with check_same_thread on;
    # setting it up from the event loop's thread used to fail the first operation.
    engine = create_async_engine("sqlite+aiosqlite:///:memory:")
    try:
        await jobrun.upgrade(engine)
        store = jobrun.SqlJobRunStore(engine)
        registry = jobrun.JobRegistry()

        @registry.job("memory", "walk")
        async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
            await p.step("only", lambda: 1)
            p.count("objects")
            return jobrun.PassResult(done=True)

        run = await jobrun.start_job_run(store, module_id="memory", job="walk")
        report = await jobrun.run_due_jobs(store, registry)
        assert report.completed == 1
        done = await jobrun.get_job_run(store, run.id)
        assert done is not None
        assert (done.status, done.counters) == ("done", {"objects": 1})
    finally:
        await engine.dispose()
