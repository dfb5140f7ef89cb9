"""The parts of the many-databases worker that need no worker: inotify through ctypes,
the open-store bound, and the URLs file's lines."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from jobrun._cli.many_databases import urls_in
from jobrun._inotify import database_of, open_watch
from jobrun._system import resolve_clock
from jobrun._worker_database import ServedDatabase
from jobrun.sql.next_due import sqlite_next_due_at
from jobrun.sql.store import SqlJobRunStore
from jobrun.wakeups import OpenStores


def test_a_urls_file_skips_blank_lines_and_comments() -> None:
    lines = ["# tenants\n", "\n", "  sqlite:///a.db  \n", "#sqlite:///b.db\n", "postgresql://x/y"]
    assert urls_in(lines) == ["sqlite:///a.db", "postgresql://x/y"]


def test_a_write_file_names_its_database() -> None:
    assert database_of(Path("/d/a.db-wal")) == Path("/d/a.db")
    assert database_of(Path("/d/a.db-journal")) == Path("/d/a.db")
    assert database_of(Path("/d/a.db")) == Path("/d/a.db")
    assert database_of(Path("/d/a.db-shm")) == Path("/d/a.db-shm")


def test_inotify_sees_a_write_and_not_a_read(sqlite_template: Path, tmp_path: Path) -> None:
    watch = open_watch()
    if watch is None:
        pytest.skip("no inotify here")
    path = tmp_path / "scope.db"
    shutil.copyfile(sqlite_template, path)
    try:
        assert watch.add(tmp_path)
        watch.read()
        # A read, as the worker's own probe makes: nothing to wake anyone for.
        assert sqlite_next_due_at(path) is None
        assert {database_of(each) for each in watch.read()} == set()
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("CREATE TABLE written (x)")
        assert path in {database_of(each) for each in watch.read()}
    finally:
        watch.close()


async def test_at_most_limit_engines_stay_open(sqlite_template: Path, tmp_path: Path) -> None:
    stores = OpenStores(2)
    engines = []
    for number in range(3):
        path = tmp_path / f"scope-{number}.db"
        shutil.copyfile(sqlite_template, path)
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}", poolclass=NullPool)
        stores.manage(engine)
        engines.append(engine)
    try:
        for engine in engines * 2:
            async with stores.use(engine), engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
            assert stores.open_count <= 2
        assert (stores.opened, stores.closed) == (6, 4)
    finally:
        for engine in engines:
            await engine.dispose()


async def test_a_driver_that_goes_idle_after_the_stop_does_not_wait(tmp_path: Path) -> None:
    # The race behind a worker that once did not return after its stop: driver A is idle
    # when the stop comes, so the stopper's one wake_all goes to A and leaves nothing
    # pending; driver B, back from a read it was awaiting, then goes idle with no timeout.
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'scope.db'}", poolclass=NullPool)
    database = ServedDatabase(SqlJobRunStore(engine), resolve_clock(None))
    first = asyncio.create_task(database.idle(None))
    await asyncio.sleep(0)  # sleep: lets A reach its wait
    database.stop.set()
    database.wake_all()
    assert await first is True
    assert database.pending is False
    second = asyncio.create_task(database.idle(None))
    # A ceiling for a hang, not a speed goal.
    assert await asyncio.wait_for(second, 5) is True
    await engine.dispose()
