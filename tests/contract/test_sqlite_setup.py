"""A store on a plain SQLite engine sets the connection up itself.

WAL (readers beside the writer) and a busy timeout (writers in other processes
wait instead of failing with "database is locked"), on every connection the
store uses, including one the host's pool opened before the store existed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

import jobrun
from jobrun.sql.executor import _sqlite_connections

BUSY_TIMEOUT_MS = 4321  # distinct from the driver's default (5000) and jobrun's (30000)
KEY = {"module_id": "@test/jobs", "job": "walk"}

# Another process takes SQLite's write lock, says so, holds it until told, then commits.
HOLD_LOCK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
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
    sqlite_url: str, busy_timeout_ms: int, look_s: float, *, set_up_first: bool = True
) -> bool:
    """Start a run while another process holds the write lock, which it lets go once the
    start has ended or ``look_s`` seconds have passed; say whether the start was still
    waiting then. The start's own outcome (a run, or the store's error) propagates."""
    path = make_url(sqlite_url).database
    assert path is not None
    engine = create_async_engine(sqlite_url)
    try:
        store = jobrun.SqlJobRunStore(engine, sqlite_busy_timeout_ms=busy_timeout_ms)
        if set_up_first:
            # Set up (WAL, schema check) before the other process arrives.
            assert await jobrun.get_job_run(store, "0" * 26) is None
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLD_LOCK,
            path,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdin is not None
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), timeout=30)
            assert line == b"locked\n"
            starting = asyncio.create_task(jobrun.start_job_run(store, **KEY))
            # A look, not a pass condition: load only makes the start wait longer.
            ended, _ = await asyncio.wait({starting}, timeout=look_s)
            holder.stdin.write(b"release\n")
            await holder.stdin.drain()
            await starting
        finally:
            if holder.returncode is None and holder.stdin is not None:
                holder.stdin.close()
            assert await asyncio.wait_for(holder.wait(), timeout=30) == 0
        return not ended
    finally:
        await engine.dispose()


async def test_a_writer_in_another_process_makes_jobrun_wait_not_fail(sqlite_url: str) -> None:
    # Half a second into a 10 s busy timeout the start still waits for the lock, and
    # gets through once the lock is let go.
    assert await _start_while_another_process_holds_the_lock(sqlite_url, 10_000, look_s=0.5)
    engine = create_async_engine(sqlite_url)
    try:
        runs = await jobrun.job_runs(jobrun.SqlJobRunStore(engine), **KEY)
        assert len(runs) == 1
    finally:
        await engine.dispose()


async def test_a_first_connection_that_meets_a_writer_while_switching_to_wal_waits(
    sqlite_url: str,
) -> None:
    # The migrated file is still in rollback-journal mode: the store's first connection
    # switches it to WAL. SQLite refuses that switch at once, busy timeout or not, while
    # another connection holds the write lock; the store waits for the lock instead.
    path = make_url(sqlite_url).database
    assert path is not None
    assert _journal_mode(path) == "delete"
    assert await _start_while_another_process_holds_the_lock(
        sqlite_url, 10_000, look_s=0.5, set_up_first=False
    )
    assert _journal_mode(path) == "wal"


def _journal_mode(path: str) -> str:
    connection = sqlite3.connect(path)
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


async def test_the_configured_timeout_is_the_one_that_applies(sqlite_url: str) -> None:
    # The same lock, held until the start ends (60 s only bounds a hang), with a 50 ms
    # timeout: the store gives up.
    with pytest.raises(jobrun.StoreError, match="database is locked"):
        await _start_while_another_process_holds_the_lock(sqlite_url, 50, look_s=60)


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
