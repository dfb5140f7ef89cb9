"""The raw driver floors jobrun's steps are measured against.

* the plain floor: a one-row ``INSERT ... ON CONFLICT DO UPDATE`` into a table shaped
  like the step ledger (``bench_upsert``), on one driver connection in autocommit
  (aiosqlite with WAL and ``synchronous=NORMAL``; asyncpg), so durable when it returns;
* the fenced floor: jobrun's own step statement, the exact text its store sends with
  the parameters it builds, on a run held by a token of its own.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

import jobrun

from .databases import SQLITE_PRAGMAS, driver_dsn

SCRATCH = (
    "CREATE TABLE IF NOT EXISTS bench_upsert (run_id TEXT NOT NULL, step TEXT NOT NULL, "
    "result TEXT, attempts INTEGER NOT NULL, last_error TEXT, recorded_at TEXT NOT NULL, "
    "PRIMARY KEY (run_id, step))"
)
UPSERT = (
    "INSERT INTO bench_upsert (run_id, step, result, attempts, last_error, recorded_at) "
    "VALUES ({0}) ON CONFLICT (run_id, step) DO UPDATE SET result = excluded.result, "
    "attempts = excluded.attempts, last_error = excluded.last_error, "
    "recorded_at = excluded.recorded_at"
)


class Raw:
    """One driver connection in autocommit, and the statements the floors send."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.connection: Any = None

    async def open(self, engine: Any) -> None:
        if self.backend == "sqlite":
            import aiosqlite

            self.connection = await aiosqlite.connect(driver_dsn(engine), isolation_level=None)
            for pragma in SQLITE_PRAGMAS:
                await self.connection.execute(f"PRAGMA {pragma}")
        else:
            import asyncpg

            self.connection = await asyncpg.connect(driver_dsn(engine))
        await self.execute(SCRATCH, [])

    async def execute(self, sql: str, values: list[Any]) -> None:
        # Executed and fetched (jobrun's step write returns a row on Postgres; on
        # SQLite it returns none and jobrun reads the change count instead).
        if self.backend == "sqlite":
            await self.connection.execute_fetchall(sql, values)
        else:
            await self.connection.fetch(sql, *values)

    def marks(self, count: int) -> str:
        if self.backend == "sqlite":
            return ", ".join("?" * count)
        return ", ".join(f"${n}" for n in range(1, count + 1))


def like_the_floor(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


async def held_run(engine: Any) -> tuple[str, str]:
    """A running run leased to a token of its own, for the fenced raw statements
    (of a job no benchmark registers, so no driver claims it)."""
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(
        store, module_id="bench", job="held", instance=uuid.uuid4().hex
    )
    token = uuid.uuid4().hex
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE _substrat_job_runs SET lease_owner = :token WHERE id = :id"),
            {"id": run.id, "token": token},
        )
    return run.id, token


def step_statement(engine: Any, held: tuple[str, str]) -> tuple[str, list[Any], tuple[int, ...]]:
    """The exact SQL text jobrun's store sends for a new step, its parameter list
    (built as the store builds it) and where the step's name sits in that list
    (twice on SQLite, whose statement reads the run again while it is paused)."""
    prepared = jobrun.SqlJobRunStore(engine)._statements.record_step
    name = object()
    values = {
        "fence_id": held[0],
        "fence_token": held[1],
        "step_run_id": held[0],
        "step_step": name,
        "step_result": "1",
        "step_attempts": 1,
        "step_last_error": None,
        "step_recorded_at": "2026-01-01T00:00:00.000Z",
    }
    arguments = prepared.arguments(values)
    return prepared.sql, arguments, tuple(at for at, value in enumerate(arguments) if value is name)
