"""The pauses facet of the SQL store (revision 0009, :mod:`jobrun._core.operator.pausing`;
statements in :mod:`jobrun.sql.statements.pauses`).

A run's own pause and unpause are operator changes (one conditional write, the
change statement of :mod:`jobrun.sql.statements.operator`); a job's and a limit
key's are records, each written with what goes with it in one short transaction;
and the reads that say what is paused. An unpause wakes the listening workers on
Postgres as a start does (SQLite's workers see the write itself).
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from jobrun._core import PauseRecord, RunChange, pause_record
from jobrun.sql.postgres.tenancy import notify_channel
from jobrun.sql.statements.operator import change_statement
from jobrun.sql.statements.pauses import (
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
from jobrun.sql.statements.runs import RunStatements
from jobrun.sql.store.base import SqlStoreBase
from jobrun.sql.store.runs import notify_payload_of


class SqlPauses(SqlStoreBase):
    """Pause and unpause a run, a job or a limit key; what is paused."""

    _statements: RunStatements

    async def pause(self, run_id: str, change: RunChange) -> bool:
        columns = tuple(name for name, _ in change.values)
        statement = self._shapes.of(change_statement, columns, change.leased, change.paused)
        values = {f"new_{name}": value for name, value in change.values}
        values |= {"run_id": run_id, "when_status": change.status}
        async with self._operation("pause"):
            found = await self._executor.fetch("pause", statement, values)
            if found and change.paused:
                # Unpaused: due now, so the listening workers are woken as by a start.
                await self._wake("pause", [notify_payload_of(found[0][1], found[0][2])])
        return bool(found)

    async def _wake(self, operation: str, payloads: builtins.list[str]) -> None:
        """Postgres: NOTIFY the listening workers (a payload ``""`` wakes every job's)."""
        if self._is_postgres and payloads:
            channel = notify_channel(self._schema)
            notify = {"notify_channel": channel, "payloads": json.dumps(payloads)}
            await self._executor.fetch(operation, self._statements.notify_many, notify)

    async def pause_job(self, module_id: str, job: str, at: str, reason: str | None) -> int:
        """The record, then the job's live runs, in one transaction: a start that
        commits after it reads the record and starts paused."""
        values: dict[str, Any] = {"module_id": module_id, "job": job}
        values |= {"paused_at": at, "reason": reason}
        record = self._shapes.of(pause_job_statement, self._is_postgres)
        runs = self._shapes.of(pause_job_runs_statement)
        async with self._operation("pause_job"), self._executor.transaction("pause_job") as tx:
            await tx.fetch(record, values)
            return len(await tx.fetch(runs, values))

    async def unpause_job(self, module_id: str, job: str, at: str) -> int:
        values = {"module_id": module_id, "job": job, "unpaused_at": at}
        record = self._shapes.of(unpause_job_statement)
        runs = self._shapes.of(unpause_job_runs_statement)
        async with self._operation("unpause_job"):
            async with self._executor.transaction("unpause_job") as tx:
                await tx.fetch(record, values)
                unpaused = len(await tx.fetch(runs, values))
            if unpaused:
                await self._wake("unpause_job", [notify_payload_of(module_id, job)])
        return unpaused

    async def pause_limit(self, key: str, at: str, reason: str | None) -> bool:
        statement = self._shapes.of(pause_limit_statement, self._is_postgres)
        values = {"limit_key": key, "paused_at": at, "reason": reason}
        async with self._operation("pause_limit"):
            return bool(await self._executor.fetch("pause_limit", statement, values))

    async def unpause_limit(self, key: str, reason: str) -> int:
        """The record goes first, then the runs it deferred wake: a pass deferred in
        between looks at the key again after its own write (``engine.limit_pauses``)."""
        record = self._shapes.of(unpause_limit_statement)
        wake = self._shapes.of(unpark_statement, False)
        async with self._operation("unpause_limit"):
            await self._executor.fetch("unpause_limit", record, {"limit_key": key})
            woken = len(await self._executor.fetch("unpause_limit", wake, {"reason": reason}))
            if woken:
                await self._wake("unpause_limit", [""])
        return woken

    async def limit_paused(self, key: str) -> bool:
        statement = self._shapes.of(limit_paused_statement)
        async with self._operation("limit_paused"):
            found = await self._executor.fetch("limit_paused", statement, {"limit_key": key})
        return bool(found[0][0])

    async def unpark(self, run_id: str, reason: str) -> bool:
        statement = self._shapes.of(unpark_statement, True)
        async with self._operation("unpark"):
            found = await self._executor.fetch(
                "unpark", statement, {"run_id": run_id, "reason": reason}
            )
        return bool(found)

    async def pauses(
        self,
    ) -> tuple[dict[tuple[str, str], PauseRecord], dict[str, PauseRecord]]:
        async with self._operation("pauses"):
            jobs = await self._executor.fetch("pauses", self._shapes.of(job_pauses_statement), {})
            keys = await self._executor.fetch("pauses", self._shapes.of(limit_pauses_statement), {})
        return (
            {(module_id, job): pause_record(at, why) for module_id, job, at, why in jobs},
            {key: pause_record(at, why) for key, at, why in keys},
        )
