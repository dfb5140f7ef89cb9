"""The operator facet of the SQL store: what operators do by hand, and what they read
(``OperatorStore``; statements in :mod:`jobrun.sql.statements.operator`).

Every change is one conditional write on the run's status (a resume also gives
its failed steps their attempts back, in the same transaction); pruning deletes
in batches, each run checked again as it goes. Also here: each job's recorded
retention and the rows of the workers that said they are alive. Cooling a limit
down and the limits' usage are in :mod:`jobrun.sql.store.limits`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from jobrun._core import HealthCounts, RunChange, WorkerRow
from jobrun.errors import JobConflictError, StoreError
from jobrun.sql.statements.operator import (
    OperatorStatements,
    beat_worker_statement,
    beat_worker_values,
    change_statement,
    forget_retention_statement,
    forget_worker_statement,
    live_workers_statement,
    prune_ledgers,
    prune_runs,
    record_retention_statement,
    recorded_retention_statement,
    sweep_workers_statement,
)
from jobrun.sql.store.base import SqlStoreBase, numbered, pairs


class SqlOperator(SqlStoreBase):
    """Health, due and version counts, cancel, resume, release, prune, retention and
    the workers' rows."""

    _operator_statements: OperatorStatements

    async def health(self, now_at: str) -> HealthCounts:
        async with self._operation("health"):
            found = await self._executor.fetch(
                "health", self._operator_statements.health, {"now_at": now_at}
            )
        row = found[0]
        return HealthCounts(
            int(row[0]),
            int(row[1]),
            int(row[2]),
            int(row[3]),
            row[4],
            cancelled=int(row[5]),
            paused=int(row[6]),
        )

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        async with self._operation("due_by_job"):
            found = await self._executor.fetch(
                "due_by_job", self._operator_statements.due_by_job, {"now_at": now_at}
            )
        return {(module_id, job): int(count) for module_id, job, count in found}

    async def versions_by_job(self) -> dict[tuple[str, str], dict[int, int]]:
        async with self._operation("versions_by_job"):
            found = await self._executor.fetch(
                "versions_by_job", self._operator_statements.versions_by_job, {}
            )
        counts: dict[tuple[str, str], dict[int, int]] = {}
        for module_id, job, version, runs in found:
            counts.setdefault((module_id, job), {})[int(version)] = int(runs)
        return counts

    def _change(self, run_id: str, change: RunChange) -> tuple[Any, dict[str, Any]]:
        """The conditional write that applies an operator's ``change``, and its values."""
        columns = tuple(name for name, _ in change.values)
        statement = self._shapes.of(change_statement, columns, change.leased, change.paused)
        values = {f"new_{name}": value for name, value in change.values}
        return statement, values | {"run_id": run_id, "when_status": change.status}

    async def cancel(self, run_id: str, change: RunChange) -> bool:
        return await self._lone_write("cancel", *self._change(run_id, change))

    async def resume(self, run_id: str, change: RunChange) -> bool:
        statement, values = self._change(run_id, change)
        try:
            async with self._operation("resume"), self._executor.transaction("resume") as tx:
                if not await tx.fetch(statement, values):
                    return False
                await tx.fetch(self._operator_statements.refill, values)
                return True
        except StoreError as error:
            if error.__cause__ is not None and self._executor.is_unique_violation(error.__cause__):
                raise JobConflictError(
                    f"run {run_id} cannot resume: another run of its key is live",
                    "job_run_key_live",
                ) from error.__cause__
            raise

    async def release(self, run_id: str, change: RunChange) -> bool:
        return await self._lone_write("release", *self._change(run_id, change))

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        if only_jobs is not None and not only_jobs:
            return 0
        only = None if only_jobs is None else sorted(only_jobs)
        excepted = sorted(except_jobs)
        shape = (len(statuses), None if only is None else len(only), len(excepted))
        doomed = self._shapes.of(prune_runs, *shape)
        values = {"ended_before": ended_before, "batch_size": batch_size}
        values |= numbered("pruned_status", statuses) | pairs("only_", only or [])
        values |= pairs("except_", excepted)
        # The runs first, each re-checked as it is deleted (a run resumed since the
        # batch was chosen is running again and stays), then the ledgers of exactly
        # the runs deleted: a resume can never keep its row and lose its ledger.
        deleted = 0
        while True:
            async with self._operation("prune"), self._executor.transaction("prune") as tx:
                ids = [row[0] for row in await tx.fetch(doomed, values)]
                if ids:
                    ledgers = self._shapes.of(prune_ledgers, len(ids))
                    await tx.fetch(ledgers, numbered("id", ids))
            deleted += len(ids)
            if len(ids) < batch_size:
                return deleted

    # -- each job's own keep_for ---------------------------------------------------------

    async def record_retention(
        self, keep_for_s: Mapping[tuple[str, str], int | None], at: str
    ) -> None:
        if not keep_for_s:
            return
        record = self._shapes.of(record_retention_statement, self._is_postgres)
        forget = self._shapes.of(forget_retention_statement)
        async with (
            self._operation("record_retention"),
            self._executor.transaction("record_retention") as transaction,
        ):
            for (module_id, job), seconds in sorted(keep_for_s.items()):
                key = {"kept_module_id": module_id, "kept_job": job}
                if seconds is None:
                    await transaction.fetch(forget, key)
                else:
                    values = key | {"keep_for_s": seconds, "updated_at": at}
                    await transaction.fetch(record, values)

    async def recorded_retention(self) -> dict[tuple[str, str], int]:
        statement = self._shapes.of(recorded_retention_statement)
        async with self._operation("recorded_retention"):
            rows = await self._executor.fetch("recorded_retention", statement, {})
        return {(row[0], row[1]): int(row[2]) for row in rows}

    # -- the workers that said they are alive ----------------------------------------------

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        # One statement; with ``sweep_at``, a second deletes the rows of workers gone by then.
        beat = self._shapes.of(beat_worker_statement, self._is_postgres)
        values = beat_worker_values(row)
        async with self._operation("beat_worker"):
            await self._executor.fetch("beat_worker", beat, values)
            if sweep_at is not None:
                sweep = self._shapes.of(sweep_workers_statement)
                await self._executor.fetch("beat_worker", sweep, {"now_at": sweep_at})

    async def forget_worker(self, worker_id: str) -> None:
        statement = self._shapes.of(forget_worker_statement)
        async with self._operation("forget_worker"):
            await self._executor.fetch("forget_worker", statement, {"worker_id": worker_id})

    async def live_workers(self, now_at: str) -> builtins.list[WorkerRow]:
        statement = self._shapes.of(live_workers_statement)
        async with self._operation("live_workers"):
            rows = await self._executor.fetch("live_workers", statement, {"now_at": now_at})
        return [WorkerRow(*row) for row in rows]
