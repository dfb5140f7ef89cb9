"""The operator facet of the memory store: what operators do by hand, and what they read."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import replace

from jobrun._core import (
    HealthCounts,
    JobRunStatus,
    RunChange,
    WorkerRow,
    is_cancelled,
    is_due,
    is_leased,
    is_live,
    is_paused,
    is_prunable,
    live_run_of,
    refill_on_resume,
    stored_version,
    waiting_since,
    worker_is_live,
)
from jobrun._testing.memory.base import MemoryStoreBase
from jobrun.errors import JobConflictError


class MemoryOperator(MemoryStoreBase):
    """Health, due and version counts, cancel, resume, release, prune, retention and
    the workers' rows."""

    retention: dict[tuple[str, str], int]
    workers: dict[str, WorkerRow]

    async def health(self, now_at: str) -> HealthCounts:
        rows = self.runs.values()
        waiting = [waiting_since(row) for row in rows if is_due(row, now_at)]
        return HealthCounts(
            running=sum(1 for row in rows if is_live(row)),
            due=len(waiting),
            leased=sum(1 for row in rows if is_leased(row, now_at)),
            failed=sum(1 for row in self.runs.values() if row.status == JobRunStatus.FAILED),
            oldest_due_at=min(waiting, default=None),
            cancelled=sum(1 for row in self.runs.values() if is_cancelled(row)),
            paused=sum(1 for row in self.runs.values() if is_paused(row)),
        )

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for row in self.runs.values():
            if is_due(row, now_at):
                key = (row.module_id, row.job)
                counts[key] = counts.get(key, 0) + 1
        return counts

    async def versions_by_job(self) -> dict[tuple[str, str], dict[int, int]]:
        counts: dict[tuple[str, str], dict[int, int]] = {}
        for row in self.runs.values():
            if is_live(row):
                versions = counts.setdefault((row.module_id, row.job), {})
                version = stored_version(row)
                versions[version] = versions.get(version, 0) + 1
        return counts

    def _change(self, run_id: str, change: RunChange) -> bool:
        row = self.runs.get(run_id)
        if row is None or not change.applies_to(row):
            return False
        self.runs[run_id] = change.applied(row)
        return True

    async def cancel(self, run_id: str, change: RunChange) -> bool:
        return self._change(run_id, change)

    async def resume(self, run_id: str, change: RunChange) -> bool:
        row = self.runs.get(run_id)
        if row is None or not change.applies_to(row):
            return False
        if live_run_of(self.runs.values(), row) is not None:
            raise JobConflictError(
                f"run {run_id} cannot resume: another run of its key is live", "job_run_key_live"
            )
        self._change(run_id, change)
        ledger = self.ledgers.get(run_id, {})
        for name, (step, recorded_at) in builtins.list(ledger.items()):
            ledger[name] = (refill_on_resume(step), recorded_at)
        return True

    async def release(self, run_id: str, change: RunChange) -> bool:
        return self._change(run_id, change)

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        doomed = [
            run_id
            for run_id, row in self.runs.items()
            if is_prunable(row, ended_before, statuses, only_jobs, except_jobs)
        ]
        for run_id in doomed:
            del self.runs[run_id]
            self.ledgers.pop(run_id, None)
        return len(doomed)

    async def record_retention(
        self, keep_for_s: Mapping[tuple[str, str], int | None], at: str
    ) -> None:
        for key, seconds in keep_for_s.items():
            if seconds is None:
                self.retention.pop(key, None)
            else:
                self.retention[key] = seconds

    async def recorded_retention(self) -> dict[tuple[str, str], int]:
        return dict(sorted(self.retention.items()))

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        found = self.workers.get(row.id)
        if found is not None:
            row = replace(
                found, jobs=row.jobs, heartbeat_at=row.heartbeat_at, expires_at=row.expires_at
            )
        self.workers[row.id] = row
        if sweep_at is not None:
            for worker in list(self.workers.values()):
                if not worker_is_live(worker, sweep_at):
                    del self.workers[worker.id]

    async def forget_worker(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)

    async def live_workers(self, now_at: str) -> builtins.list[WorkerRow]:
        live = [row for row in self.workers.values() if worker_is_live(row, now_at)]
        return sorted(live, key=lambda row: (row.started_at, row.id))
