"""The SQL store's pauses (revision 0009, :mod:`jobrun._core.operator.pausing`): a job's and a
limit key's records and what goes with them, one short transaction each, and the
reads that say what is paused. A run's own pause is an operator change, written by
the store itself (``SqlJobRunStore.pause``)."""

from __future__ import annotations

from typing import Any

from jobrun._core import PauseRecord, pause_record
from jobrun.sql.executor import Executor
from jobrun.sql.pause_statements import (
    job_pauses_statement,
    limit_paused_statement,
    limit_pauses_statement,
    pause_job_runs_statement,
    pause_job_statement,
    pause_limit_statement,
    unpark_statement,
    unpause_job_runs_statement,
    unpause_job_statement,
    unpause_limit_statement,
)
from jobrun.sql.statements import Shapes


class SqlPauses:
    """The pause operations of one ``SqlJobRunStore`` (which translates their errors)."""

    def __init__(self, executor: Executor, shapes: Shapes, is_postgres: bool) -> None:
        self._executor = executor
        self._shapes = shapes
        self._is_postgres = is_postgres

    async def pause_job(self, module_id: str, job: str, at: str, reason: str | None) -> int:
        """The record, then the job's live runs, in one transaction: a start that
        commits after it reads the record and starts paused."""
        values: dict[str, Any] = {
            "module_id": module_id,
            "job": job,
            "paused_at": at,
            "reason": reason,
        }
        record = self._shapes.of(pause_job_statement, self._is_postgres)
        runs = self._shapes.of(pause_job_runs_statement)
        async with self._executor.transaction("pause_job") as transaction:
            await transaction.fetch(record, values)
            return len(await transaction.fetch(runs, values))

    async def unpause_job(self, module_id: str, job: str, at: str) -> int:
        values = {"module_id": module_id, "job": job, "unpaused_at": at}
        record = self._shapes.of(unpause_job_statement)
        runs = self._shapes.of(unpause_job_runs_statement)
        async with self._executor.transaction("unpause_job") as transaction:
            await transaction.fetch(record, values)
            return len(await transaction.fetch(runs, values))

    async def pause_limit(self, key: str, at: str, reason: str | None) -> bool:
        statement = self._shapes.of(pause_limit_statement, self._is_postgres)
        values = {"limit_key": key, "paused_at": at, "reason": reason}
        return bool(await self._executor.fetch("pause_limit", statement, values))

    async def unpause_limit(self, key: str, reason: str) -> int:
        """The record goes first, then the runs it deferred wake: a pass deferred in
        between looks at the key again after its own write (``pausing``)."""
        record = self._shapes.of(unpause_limit_statement)
        await self._executor.fetch("unpause_limit", record, {"limit_key": key})
        wake = self._shapes.of(unpark_statement, False)
        return len(await self._executor.fetch("unpause_limit", wake, {"reason": reason}))

    async def limit_paused(self, key: str) -> bool:
        statement = self._shapes.of(limit_paused_statement)
        found = await self._executor.fetch("limit_paused", statement, {"limit_key": key})
        return bool(found[0][0])

    async def unpark(self, run_id: str, reason: str) -> bool:
        statement = self._shapes.of(unpark_statement, True)
        values = {"run_id": run_id, "reason": reason}
        return bool(await self._executor.fetch("unpark", statement, values))

    async def pauses(self) -> tuple[dict[tuple[str, str], PauseRecord], dict[str, PauseRecord]]:
        jobs = await self._executor.fetch("pauses", self._shapes.of(job_pauses_statement), {})
        keys = await self._executor.fetch("pauses", self._shapes.of(limit_pauses_statement), {})
        return (
            {(module_id, job): pause_record(at, why) for module_id, job, at, why in jobs},
            {key: pause_record(at, why) for key, at, why in keys},
        )
