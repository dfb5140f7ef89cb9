"""Wake-ups from SQLite files through inotify (by ctypes): a write's file names its database,
and a read wakes no one."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from jobrun._host.inotify import database_of, open_watch
from jobrun.sql.next_due import sqlite_next_due_at


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
