"""pytest fixtures for testing your own jobs. Not active unless you ask for it:

    # conftest.py
    pytest_plugins = ["jobrun.pytest_plugin"]

Needs pytest-asyncio. Fixtures: ``jobrun_clock`` (a ``FakeClock`` with autojump),
``jobrun_memory_store`` (a fresh in-memory store) and ``jobrun_sqlite_store`` (a
migrated SQLite file in ``tmp_path``). See ``jobrun.testing`` for the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from jobrun.testing import FakeClock, MemoryJobRunStore, sqlite_store

if TYPE_CHECKING:
    from jobrun.sql.store import SqlJobRunStore


@pytest.fixture
def jobrun_clock() -> FakeClock:
    """A test clock whose time jumps to the next deadline whenever every task waits."""
    return FakeClock(autojump=True)


@pytest.fixture
def jobrun_memory_store() -> MemoryJobRunStore:
    """A fresh, empty in-memory store (no database), one per test."""
    return MemoryJobRunStore()


@pytest_asyncio.fixture
async def jobrun_sqlite_store(tmp_path: Path) -> AsyncIterator[SqlJobRunStore]:
    """A store on a migrated SQLite file in the test's ``tmp_path``, disposed after it."""
    async with sqlite_store(tmp_path / "jobrun.db") as store:
        yield store
