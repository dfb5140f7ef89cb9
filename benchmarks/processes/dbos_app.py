"""DBOS Transact set up alike in every process that runs it (the ``bench`` extra).

DBOS keeps one global instance per process, bound to one system database: the
processes that compare it with jobrun make it here, on a throwaway database, with
jobrun's SQLite settings on a SQLite system database.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import SQLITE_PRAGMAS, Databases, Sample, timed_ms


async def system_database_url(databases: Databases, backend: str) -> str:
    """A new, empty database for DBOS's system tables: its URL as DBOS takes it."""
    if backend == "sqlite":
        return f"sqlite:///{databases.sqlite_path('dbos')}"
    return await databases.postgres_url("postgresql")


def dbos_config(name: str, system_url: str) -> dict[str, Any]:
    """DBOS's configuration; on SQLite an engine with jobrun's settings (WAL,
    ``synchronous=NORMAL``)."""
    import sqlalchemy as sa

    config: dict[str, Any] = {"name": name, "log_level": "WARNING"}
    config["system_database_url"] = system_url
    if system_url.startswith("sqlite"):
        wal = sa.create_engine(system_url)

        @sa.event.listens_for(wal, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            for pragma in SQLITE_PRAGMAS:
                dbapi_connection.execute(f"PRAGMA {pragma}")

        config["system_database_engine"] = wal
    return config


async def dbos_runner(
    databases: Databases, backend: str, name: str, n: int
) -> tuple[Sample, Callable[[], None]]:
    """DBOS launched on a new system database, and a sample: one workflow of ``n``
    trivial ``@DBOS.step`` calls, ms per step; and what shuts DBOS down."""
    from dbos import DBOS

    system_url = await system_database_url(databases, backend)
    DBOS(config=dbos_config(name, system_url))  # type: ignore[arg-type]  # a TypedDict

    @DBOS.step()
    async def trivial(index: int) -> int:
        return index

    @DBOS.workflow()
    async def workflow(count: int) -> int:
        return sum([await trivial(index) for index in range(count)])

    DBOS.launch()

    async def sample() -> float:
        started = time.perf_counter()
        handle = await DBOS.start_workflow_async(workflow, n)
        assert await handle.get_result() == n * (n - 1) // 2
        return timed_ms(started, n)

    return sample, DBOS.destroy
