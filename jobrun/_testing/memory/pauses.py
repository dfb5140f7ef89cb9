"""The pauses facet of ``MemoryJobRunStore`` (revision 0009): a run's pause and unpause
as operator changes, a job's and a limit key's records, and what a paused limit
deferred (as :mod:`jobrun.sql.store.pauses` does for the SQL store)."""

from __future__ import annotations

import builtins
from dataclasses import replace

from jobrun._core import (
    PARKED_AT,
    PauseRecord,
    RunChange,
    RunRow,
    is_live,
    is_paused,
    pause_record,
    pause_transition,
    unpause_transition,
)
from jobrun._testing.memory.base import MemoryStoreBase


def _waits_for_limit(row: RunRow, reason: str) -> bool:
    """Deferred by the paused limit ``reason`` names, waiting for its unpause."""
    return (
        is_live(row)
        and row.paused_at is None
        and row.lease_owner is None
        and row.next_attempt_at == PARKED_AT
        and row.deferred_reason == reason
    )


class MemoryPauses(MemoryStoreBase):
    """Pause and unpause a run, a job or a limit key; what is paused."""

    async def pause(self, run_id: str, change: RunChange) -> bool:
        row = self.runs.get(run_id)
        if row is None or not change.applies_to(row):
            return False
        self.runs[run_id] = change.applied(row)
        return True

    def _runs_of(self, module_id: str, job: str, paused: bool) -> builtins.list[RunRow]:
        return [
            row
            for row in self.runs.values()
            if (row.module_id, row.job) == (module_id, job)
            and is_live(row)
            and is_paused(row) == paused
        ]

    async def pause_job(self, module_id: str, job: str, at: str, reason: str | None) -> int:
        self.job_pauses.setdefault((module_id, job), (at, reason))
        change = pause_transition(at, reason)
        paused = self._runs_of(module_id, job, paused=False)
        for row in paused:
            self.runs[row.id] = change.applied(row)
        return len(paused)

    async def unpause_job(self, module_id: str, job: str, at: str) -> int:
        self.job_pauses.pop((module_id, job), None)
        change = unpause_transition(at)
        unpaused = self._runs_of(module_id, job, paused=True)
        for row in unpaused:
            self.runs[row.id] = change.applied(row)
        return len(unpaused)

    async def pause_limit(self, key: str, at: str, reason: str | None) -> bool:
        if key in self.limit_pauses:
            return False
        self.limit_pauses[key] = (at, reason)
        return True

    async def unpause_limit(self, key: str, reason: str) -> int:
        self.limit_pauses.pop(key, None)
        waiting = [row for row in self.runs.values() if _waits_for_limit(row, reason)]
        for row in waiting:
            self.runs[row.id] = replace(row, next_attempt_at=None)
        return len(waiting)

    async def limit_paused(self, key: str) -> bool:
        return key in self.limit_pauses

    async def unpark(self, run_id: str, reason: str) -> bool:
        row = self.runs.get(run_id)
        if row is None or not _waits_for_limit(row, reason):
            return False
        self.runs[run_id] = replace(row, next_attempt_at=None)
        return True

    async def pauses(
        self,
    ) -> tuple[dict[tuple[str, str], PauseRecord], dict[str, PauseRecord]]:
        jobs = {job: pause_record(*self.job_pauses[job]) for job in sorted(self.job_pauses)}
        keys = {key: pause_record(*self.limit_pauses[key]) for key in sorted(self.limit_pauses)}
        return jobs, keys
