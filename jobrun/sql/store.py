"""``SqlJobRunStore``: the store port on SQLAlchemy Core, for SQLite and Postgres.

Every operation sends statements from :mod:`jobrun.sql.statements` through the
store's one executor (:mod:`jobrun.sql.executor`); round trips per operation are
listed in ``docs/design.md`` ("Round trips").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import astuple
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core.port import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_STEP_RESULT_BYTES,
    StoreLimits,
)
from jobrun._core.records import (
    ClaimRequest,
    HealthCounts,
    RunFilter,
    RunPatch,
    RunRow,
    StepRow,
)
from jobrun.errors import JobConflictError, SchemaOutdatedError, StoreError
from jobrun.sql.executor import Compiler, StatementHook, executor_for
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.sqlite_setup import configure_sqlite
from jobrun.sql.statements import (
    LIST_FILTERS,
    NOTIFY_CHANNEL,
    PATCH_COLUMNS,
    RUN_COLUMNS,
    Shapes,
    Statements,
    claim_statement,
    list_statement,
    prune_statements,
)

__all__ = ["NOTIFY_CHANNEL", "SqlJobRunStore", "notify_payload"]

_START_RETRIES = 10
_NOTIFY_MAX_BYTES = 7000  # Postgres refuses payloads of 8000 bytes and more


def notify_payload(row: RunRow) -> str:
    """``["module_id", "job"]`` as JSON (a module id may itself contain ``/``); empty when
    too long for a notification (listeners then wake for any job)."""
    text = json.dumps([row.module_id, row.job])
    return text if len(text.encode("utf-8")) <= _NOTIFY_MAX_BYTES else ""


def _values(prefix: str, record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {f"{prefix}{name}": value for name, value in zip(names, astuple(record), strict=True)}


def _fence_values(run_id: str, token: str) -> dict[str, Any]:
    return {"fence_id": run_id, "fence_token": token}


class SqlJobRunStore:
    """Runs and step ledgers in a SQLite or Postgres database reached through ``engine``.

    Works with a plain engine and honours its configuration (pool, connect and
    checkout events): on SQLite it turns on WAL and a busy timeout for the
    connections it uses. The schema must have been created with
    :func:`jobrun.upgrade`; the first operation checks that, once.

    Statements go straight to the driver (aiosqlite, asyncpg), so SQLAlchemy's
    statement events do not see them: ``statement_hook`` is called as
    ``async with statement_hook(operation, sql, parameters):`` around every statement it
    sends, for counting, tracing or fault injection (see
    :data:`jobrun.StatementHook`).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_cursor_bytes: int | None = None,
        max_step_result_bytes: int = DEFAULT_MAX_STEP_RESULT_BYTES,
        sqlite_busy_timeout_ms: int = 30_000,
        statement_hook: StatementHook | None = None,
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
        self._executor = executor_for(engine, statement_hook)
        self._is_postgres = engine.dialect.name == "postgresql"
        if not self._is_postgres:
            configure_sqlite(engine, sqlite_busy_timeout_ms)
        compile_ = Compiler(engine.dialect)
        self._statements = Statements(compile_, self._is_postgres)
        self._shapes = Shapes(compile_)
        self._schema_checked = False

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
        except self._executor.errors as error:
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

    async def _one(self, operation: str, statement: Any, values: Mapping[str, Any]) -> bool:
        """A lone write that returns a row when it applied (the step write's path: the
        error translation of ``_operation`` spelled out, without a context manager)."""
        if not self._schema_checked:
            async with self._operation(operation):
                pass
        try:
            return bool(await self._executor.fetch(operation, statement, values))
        except self._executor.errors as error:
            raise StoreError(operation, error) from error

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        values = _values("row_", row, RUN_COLUMNS) | {"notify_payload": notify_payload(row)}
        statements = self._statements
        async with self._operation("start_or_join"):
            for _ in range(_START_RETRIES):
                # The partial unique index decides: at most one live row per key,
                # whatever number of hosts race here. On Postgres the NOTIFY that
                # wakes listening workers rides in the same statement.
                if await self._executor.fetch("start_or_join", statements.start, values):
                    return row, True
                found = await self._executor.fetch("start_or_join", statements.live, values)
                if found:
                    return RunRow(*found[0]), False
                # The live run ended between our insert and our read: try again.
        raise StoreError("start_or_join", RuntimeError("the key's live run kept changing; gave up"))

    async def get(self, run_id: str) -> RunRow | None:
        async with self._operation("get"):
            found = await self._executor.fetch("get", self._statements.get, {"run_id": run_id})
        return RunRow(*found[0]) if found else None

    async def claim(self, request: ClaimRequest) -> RunRow | None:
        if not request.expires_at:
            return None
        jobs = list(request.expires_at.items())
        one_expiry = len(set(request.expires_at.values())) == 1
        skipped = sorted(request.skip_ids)
        statement = self._shapes.get(
            ("claim", len(jobs), one_expiry, len(skipped)),
            lambda: claim_statement(len(jobs), one_expiry, len(skipped)),
        )
        values: dict[str, Any] = {
            "now_at": request.now_at,
            "token": request.token,
            "driver": request.driver,
        }
        for index, ((module_id, job), expires_at) in enumerate(jobs):
            values |= {f"module_{index}": module_id, f"job_{index}": job}
            values[f"expires_{index}"] = expires_at
        values |= {f"skip_{index}": run_id for index, run_id in enumerate(skipped)}
        async with self._operation("claim"):
            # One statement, one round trip: choosing and leasing cannot come apart.
            found = await self._executor.fetch("claim", statement, values)
        return RunRow(*found[0]) if found else None

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        given = tuple(name for name in LIST_FILTERS if getattr(run_filter, name) is not None)
        statement = self._shapes.get(("list", given), lambda: list_statement(given))
        values: dict[str, Any] = {f"filter_{name}": getattr(run_filter, name) for name in given}
        values["limit"] = run_filter.limit
        async with self._operation("list"):
            rows = await self._executor.fetch("list", statement, values)
        return [RunRow(*row) for row in rows]

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = _fence_values(run_id, token) | _values("new_", patch, PATCH_COLUMNS)
        return await self._one("patch", self._statements.patch, values)

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = _fence_values(run_id, token) | _values("new_", patch, PATCH_COLUMNS)
        statements = self._statements
        if self._is_postgres:
            return await self._one("commit_pass", statements.commit_in_one, values)
        # SQLite has no data-modifying CTEs: two statements, one transaction.
        async with self._operation("commit_pass"), self._executor.transaction("commit_pass") as tx:
            if not await tx.fetch(statements.patch, values):
                return False
            await tx.fetch(statements.drop_ledger, values)
            return True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        async with self._operation("steps"):
            rows = await self._executor.fetch("steps", self._statements.steps, {"run_id": run_id})
        return {row[0]: StepRow(*row) for row in rows}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        # The one write that makes a step durable: one statement, committed on return.
        values = {
            "fence_id": run_id,
            "fence_token": token,
            "step_run_id": run_id,
            "step_step": row.step,
            "step_result": row.result,
            "step_attempts": row.attempts,
            "step_last_error": row.last_error,
            "step_recorded_at": recorded_at,
        }
        return await self._one("record_step", self._statements.record_step, values)

    async def extend_lease(self, run_id: str, token: str, expires_at: str) -> bool:
        values = _fence_values(run_id, token) | {"expires_at": expires_at}
        return await self._one("extend_lease", self._statements.extend_lease, values)

    async def cancel(self, run_id: str, reason: str, at: str) -> bool:
        values = {"run_id": run_id, "reason": reason, "at": at}
        return await self._one("cancel", self._statements.cancel, values)

    async def resume(self, run_id: str, at: str) -> bool:
        values = {"run_id": run_id, "at": at}
        try:
            async with self._operation("resume"), self._executor.transaction("resume") as tx:
                if not await tx.fetch(self._statements.revive, values):
                    return False
                await tx.fetch(self._statements.refill, values)
                return True
        except StoreError as error:
            if error.__cause__ is not None and self._executor.is_unique_violation(error.__cause__):
                raise JobConflictError(
                    f"run {run_id} cannot resume: another run of its key is live",
                    "job_run_key_live",
                ) from error.__cause__
            raise

    async def release(self, run_id: str) -> bool:
        return await self._one("release", self._statements.release, {"run_id": run_id})

    async def health(self, now_at: str) -> HealthCounts:
        async with self._operation("health"):
            found = await self._executor.fetch(
                "health", self._statements.health, {"now_at": now_at}
            )
        row = found[0]
        return HealthCounts(int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4])

    async def prune(self, ended_before: str, statuses: tuple[str, ...], batch_size: int) -> int:
        deleted = 0
        values: dict[str, Any] = {"ended_before": ended_before, "batch_size": batch_size}
        values |= {f"wanted_status_{index}": status for index, status in enumerate(statuses)}
        doomed, _, _ = prune_statements(len(statuses), 0)
        select_batch = self._shapes.get(("prune", len(statuses)), doomed)
        while True:
            async with self._operation("prune"), self._executor.transaction("prune") as tx:
                ids = [row[0] for row in await tx.fetch(select_batch, values)]
                if ids:
                    _, ledgers, done_runs = prune_statements(len(statuses), len(ids))
                    drop_ledgers = self._shapes.get(("prune-ledgers", len(ids)), ledgers)
                    drop_runs = self._shapes.get(("prune-runs", len(ids)), done_runs)
                    by_id = {f"id_{index}": run_id for index, run_id in enumerate(ids)}
                    await tx.fetch(drop_ledgers, by_id)
                    await tx.fetch(drop_runs, by_id)
            deleted += len(ids)
            if len(ids) < batch_size:
                return deleted
