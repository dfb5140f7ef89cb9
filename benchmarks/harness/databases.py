"""Throwaway databases: every one a scenario uses is new, named for this run alone, and
removed when the run ends, however it ends.

SQLite files go in a temporary folder of the run's own; Postgres databases are made on
the server of ``--postgres-url`` as ``jobrun_bench_<scenario>_<random>`` (two runs on one
server, or a run and the test suite, never share one, so neither drops the other's) and
dropped ``WITH (FORCE)`` at the end, after the engines made here are disposed.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import jobrun

# What the raw floors and the other systems' SQLite files get: jobrun's own settings.
SQLITE_PRAGMAS = ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 30000")


def plain_url(url: str) -> str:
    """The libpq form of a Postgres URL (for asyncpg, psql, psycopg)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def driver_dsn(engine: AsyncEngine) -> str:
    """The plain DSN (asyncpg) or file path (aiosqlite) behind ``engine``."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return plain_url(url.render_as_string(hide_password=False))


async def migrated_sqlite_files(directory: Path, count: int) -> list[Path]:
    """``count`` SQLite files in ``directory``, each upgraded to head: one file migrated,
    then copied (a migration per file costs seconds over a thousand)."""
    template = directory / "template.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{template}", poolclass=NullPool)
    await jobrun.upgrade(engine)
    await engine.dispose()
    paths = []
    for number in range(count):
        path = directory / f"scope-{number:05d}.db"
        shutil.copyfile(template, path)
        paths.append(path)
    template.unlink()
    return paths


async def server_execute(server_url: str, *statements: str) -> None:
    """Statements outside a transaction (``CREATE DATABASE``) on the server of ``server_url``."""
    import asyncpg

    connection = await asyncpg.connect(plain_url(server_url))
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


class Databases:
    """``async with Databases(server_url, "step") as databases:`` the run's databases."""

    def __init__(self, server_url: str, label: str) -> None:
        self.server_url = server_url
        self.label = label
        self.folder = Path(tempfile.mkdtemp(prefix=f"jobrun-bench-{label}-"))
        self.postgres_names: list[str] = []
        self._engines: list[AsyncEngine] = []
        self._files = 0

    async def __aenter__(self) -> Databases:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Dispose of the engines made here, drop every Postgres database, remove the folder."""
        try:
            for engine in self._engines:
                await engine.dispose()
            if self.postgres_names:
                drops = [
                    f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)' for name in self.postgres_names
                ]
                await server_execute(self.server_url, *drops)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def sqlite_path(self, stem: str = "bench") -> Path:
        """A new file name in the run's folder (nothing is created)."""
        self._files += 1
        return self.folder / f"{stem}-{self._files}.db"

    async def postgres_url(self, driver: str = "postgresql+asyncpg") -> str:
        """A new, empty Postgres database (no schema): its URL with ``driver``."""
        name = f"jobrun_bench_{self.label}_{secrets.token_hex(5)}"[:63]
        # Recorded before it exists: a failure after the CREATE still drops it.
        self.postgres_names.append(name)
        await server_execute(self.server_url, f'CREATE DATABASE "{name}"')
        target = make_url(self.server_url).set(drivername=driver, database=name)
        return target.render_as_string(hide_password=False)

    async def drop_postgres(self, url: str) -> None:
        """Drop one of the run's Postgres databases now (a scenario that makes many; it
        stays listed, and the drop at the end passes over it)."""
        name = make_url(url).database
        if name in self.postgres_names:
            await server_execute(self.server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def url(self, backend: str) -> str:
        """A new, empty database of ``backend`` (``sqlite`` or ``postgres``): its jobrun URL."""
        if backend == "sqlite":
            return f"sqlite+aiosqlite:///{self.sqlite_path()}"
        return await self.postgres_url()

    def engine_for(self, url: str, **engine_options: Any) -> AsyncEngine:
        """An engine on ``url``, disposed of when the run ends."""
        engine = create_async_engine(url, **engine_options)
        self._engines.append(engine)
        return engine

    async def engine(self, backend: str, **engine_options: Any) -> AsyncEngine:
        """A new database of ``backend`` at jobrun's head, with no runs; its engine."""
        engine = self.engine_for(await self.url(backend), **engine_options)
        await jobrun.upgrade(engine)
        return engine
