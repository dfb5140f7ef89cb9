"""The runs facet of the memory store: starts and the pass's own reads and writes."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from jobrun._core import (
    WRITTEN_PAUSED,
    RunPatch,
    RunRow,
    StepRow,
    is_paused,
    live_run_of,
    parked,
    patched,
    paused_start,
    refuse,
)
from jobrun._testing.memory.base import MemoryStoreBase


def start_in(
    runs: dict[str, RunRow],
    row: RunRow,
    job_pauses: dict[tuple[str, str], tuple[str, str | None]],
) -> tuple[RunRow, bool]:
    """Insert ``row`` into ``runs`` unless its key has a live run: ``(row, True)``, else
    ``(live_row, False)``. A start, and a schedule's slot starting its run; paused
    from its start while its job is paused (``job_pauses``)."""
    existing = live_run_of(runs.values(), row)
    if existing is not None:
        return existing, False
    job_pause = job_pauses.get((row.module_id, row.job))
    if job_pause is not None:
        row = paused_start(row, row.started_at, job_pause[1])
    runs[row.id] = row
    return row, True


class MemoryRuns(MemoryStoreBase):
    """Starts, a run by id, and the pass's writes, each fenced on the run's holder."""

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        return start_in(self.runs, row, self.job_pauses)

    async def start_many(
        self, rows: Sequence[RunRow], *, connection: object | None = None
    ) -> builtins.list[tuple[RunRow, bool]]:
        if connection is not None:
            raise refuse(
                "connection",
                "is for a SQL store's database transaction",
                message="connection= is for a SqlJobRunStore: a MemoryJobRunStore has no "
                "transaction to start a run in",
            )
        return [await self.start_or_join(row) for row in rows]

    async def get(self, run_id: str) -> RunRow | None:
        return self.runs.get(run_id)

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        if not self._held(run_id, token):
            return False
        self.runs[run_id] = parked(patched(self.runs[run_id], patch))
        return True

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> int:
        if not await self.patch(run_id, patch, token):
            return False
        self.ledgers.pop(run_id, None)
        return WRITTEN_PAUSED if self.runs[run_id].paused_at is not None else True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        return {name: row for name, (row, _at) in self.ledgers.get(run_id, {}).items()}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> int:
        if not self._held(run_id, token):
            return False
        self.ledgers.setdefault(run_id, {})[row.step] = (row, recorded_at)
        return WRITTEN_PAUSED if is_paused(self.runs[run_id]) else True
