"""The open-store bound of a many-databases worker: at most that many engines open, each
closed and opened again as the databases take turns (inotify's wake-ups:
``_host/test_inotify.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from jobrun.worker.wakeups import OpenStores


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
