"""A migrated SQLite store in a file, for tests that want the real SQL path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobrun.sql.store import SqlJobRunStore


@asynccontextmanager
async def sqlite_store(path: str | Path) -> AsyncIterator[SqlJobRunStore]:
    """A store on the SQLite file at ``path``, upgraded to the newest schema; the
    engine is disposed of on the way out (the file is left for the caller)."""
    # Imported here: tests on the memory store import jobrun.testing without SQLAlchemy.
    from sqlalchemy.ext.asyncio import create_async_engine

    from jobrun.sql.store import SqlJobRunStore
    from jobrun.sql.upgrades.migrate import upgrade

    engine = create_async_engine(f"sqlite+aiosqlite:///{Path(path)}")
    try:
        await upgrade(engine)
        yield SqlJobRunStore(engine)
    finally:
        await engine.dispose()
