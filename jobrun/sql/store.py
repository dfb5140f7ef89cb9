"""``SqlJobRunStore``: the store port on SQLAlchemy Core, for SQLite and Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core.port import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_STEP_RESULT_BYTES,
    StoreLimits,
)
from jobrun._core.records import JobRunStatus, RunFilter, RunPatch, RunRow, StepRow
from jobrun.errors import SchemaOutdatedError, StoreError
from jobrun.sql.dialect import Dialect
from jobrun.sql.schema import LIVE_ONLY, SCHEMA_REVISION, job_runs, job_steps

RUNNING = JobRunStatus.RUNNING.value
_KEY = (job_runs.c.module_id, job_runs.c.job, job_runs.c.instance)
_START_RETRIES = 10


def _run_row(mapping: Any) -> RunRow:
    return RunRow(**mapping)


class SqlJobRunStore:
    """Runs and step ledgers in a SQLite or Postgres database reached through ``engine``.

    Works with a plain engine: on SQLite it turns on WAL and a busy timeout for
    the connections it uses. The schema must have been created with
    :func:`jobrun.upgrade`; the first operation checks that, once.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_cursor_bytes: int | None = None,
        max_step_result_bytes: int = DEFAULT_MAX_STEP_RESULT_BYTES,
        sqlite_busy_timeout_ms: int = 30_000,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                "SqlJobRunStore needs an AsyncEngine (from create_async_engine), "
                f"got {type(engine).__name__}"
            )
        self._engine = engine
        self._limits = StoreLimits(
            max_payload_bytes=max_payload_bytes,
            max_cursor_bytes=max_payload_bytes if max_cursor_bytes is None else max_cursor_bytes,
            max_step_result_bytes=max_step_result_bytes,
        )
        self._dialect = Dialect(engine, sqlite_busy_timeout_ms=sqlite_busy_timeout_ms)
        self._schema_checked = False
        self._insert_run = self._dialect.insert(job_runs).on_conflict_do_nothing(
            index_elements=list(_KEY), index_where=LIVE_ONLY
        )
        upsert = self._dialect.insert(job_steps)
        self._record_step = upsert.on_conflict_do_update(
            index_elements=[job_steps.c.run_id, job_steps.c.step],
            set_={
                name: upsert.excluded[name]
                for name in ("result", "attempts", "last_error", "recorded_at")
            },
        )

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._engine

    @asynccontextmanager
    async def _operation(self, name: str) -> AsyncIterator[None]:
        """Translate driver and database errors into StoreError, once, here."""
        try:
            if not self._schema_checked:
                await self._check_schema()
            yield
        except (SQLAlchemyError, OSError) as error:
            raise StoreError(name, error) from error

    async def _check_schema(self) -> None:
        # One read per store lifetime, so that a database nobody upgraded fails
        # with the command to run rather than "no such table".
        from jobrun.sql.migrate import current_revision

        async with self._engine.connect() as connection:
            found = await connection.run_sync(current_revision)
        # Revision ids are zero-padded numbers, so text order is revision order.
        if found is None or found < SCHEMA_REVISION:
            raise SchemaOutdatedError(found, SCHEMA_REVISION)
        self._schema_checked = True

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        values = asdict(row)
        live = select(job_runs).where(
            job_runs.c.module_id == row.module_id,
            job_runs.c.job == row.job,
            job_runs.c.instance == row.instance,
            job_runs.c.status == RUNNING,
        )
        async with self._operation("start_or_join"):
            for _ in range(_START_RETRIES):
                async with self._dialect.single_statement() as connection:
                    # The partial unique index decides: at most one live row per key,
                    # whatever number of hosts race here.
                    inserted = await connection.execute(self._insert_run.values(values))
                    if inserted.rowcount == 1:
                        return row, True
                    found = (await connection.execute(live)).mappings().first()
                if found is not None:
                    return _run_row(found), False
                # The live run ended between our insert and our read: try again.
        raise StoreError("start_or_join", RuntimeError("the key's live run kept changing; gave up"))

    async def get(self, run_id: str) -> RunRow | None:
        async with self._operation("get"), self._dialect.single_statement() as connection:
            found = (
                (await connection.execute(select(job_runs).where(job_runs.c.id == run_id)))
                .mappings()
                .first()
            )
        return None if found is None else _run_row(found)

    async def due(self, now_at: str, limit: int, after_id: str | None) -> list[RunRow]:
        query = select(job_runs).where(
            job_runs.c.status == RUNNING,
            or_(job_runs.c.next_attempt_at.is_(None), job_runs.c.next_attempt_at <= now_at),
        )
        if after_id is not None:
            query = query.where(job_runs.c.id > after_id)
        query = query.order_by(job_runs.c.id).limit(limit)
        async with self._operation("due"), self._dialect.single_statement() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [_run_row(row) for row in rows]

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        conditions = [
            column == value
            for column, value in (
                (job_runs.c.module_id, run_filter.module_id),
                (job_runs.c.job, run_filter.job),
                (job_runs.c.instance, run_filter.instance),
                (job_runs.c.status, run_filter.status),
            )
            if value is not None
        ]
        query = (
            select(job_runs)
            .where(and_(True, *conditions))
            .order_by(job_runs.c.id.desc())
            .limit(run_filter.limit)
        )
        async with self._operation("list"), self._dialect.single_statement() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [_run_row(row) for row in rows]

    async def patch(self, run_id: str, patch: RunPatch) -> None:
        statement = update(job_runs).where(job_runs.c.id == run_id).values(asdict(patch))
        async with self._operation("patch"), self._dialect.single_statement() as connection:
            await connection.execute(statement)

    async def commit_pass(self, run_id: str, patch: RunPatch) -> None:
        write = update(job_runs).where(job_runs.c.id == run_id).values(asdict(patch))
        drop = delete(job_steps).where(job_steps.c.run_id == run_id)
        async with self._operation("commit_pass"):
            if self._dialect.is_postgres:
                # One statement, so one round trip, and atomic by itself.
                async with self._dialect.single_statement() as connection:
                    await connection.execute(write.add_cte(drop.cte("dropped_ledger")))
            else:
                async with self._engine.begin() as connection:
                    await connection.execute(write)
                    await connection.execute(drop)

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        query = select(
            job_steps.c.step, job_steps.c.result, job_steps.c.attempts, job_steps.c.last_error
        ).where(job_steps.c.run_id == run_id)
        async with self._operation("steps"), self._dialect.single_statement() as connection:
            rows = (await connection.execute(query)).all()
        return {
            row.step: StepRow(row.step, row.result, row.attempts, row.last_error) for row in rows
        }

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str) -> None:
        values = {
            "run_id": run_id,
            "step": row.step,
            "result": row.result,
            "attempts": row.attempts,
            "last_error": row.last_error,
            "recorded_at": recorded_at,
        }
        async with self._operation("record_step"), self._dialect.single_statement() as connection:
            await connection.execute(self._record_step.values(values))
