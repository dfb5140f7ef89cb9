"""Test doubles for code that uses jobrun: a fake clock and an in-memory store.

    clock = FakeClock()
    store = MemoryJobRunStore()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    clock.advance(seconds=5)

The memory store keeps the same contract as ``SqlJobRunStore`` (one live run per
key, atomic pass commits), so a handler tested against it behaves the same on a
database. It is not durable and not shared between processes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from jobrun._core.port import StoreLimits
from jobrun._core.records import JobRunStatus, RunFilter, RunPatch, RunRow, StepRow

__all__ = ["FakeClock", "MemoryJobRunStore"]


class FakeClock:
    """A clock that moves only when told to; call it to read the time."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start")

    def __call__(self) -> datetime:
        return self._now

    def advance(self, *, seconds: float = 0, milliseconds: float = 0) -> datetime:
        if seconds < 0 or milliseconds < 0:
            raise ValueError("a FakeClock only moves forward")
        self._now += timedelta(seconds=seconds, milliseconds=milliseconds)
        return self._now


class MemoryJobRunStore:
    """The store port in a dict. Every operation completes without yielding, so
    each is atomic with respect to other tasks on the loop."""

    def __init__(self, limits: StoreLimits | None = None, default_scope: object = None) -> None:
        self._limits = limits or StoreLimits()
        self._default_scope = default_scope
        self.runs: dict[str, RunRow] = {}
        self.ledgers: dict[str, dict[str, tuple[StepRow, str]]] = {}

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._default_scope

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        for existing in self.runs.values():
            if existing.status == JobRunStatus.RUNNING and (
                existing.module_id,
                existing.job,
                existing.instance,
            ) == (row.module_id, row.job, row.instance):
                return existing, False
        self.runs[row.id] = row
        return row, True

    async def get(self, run_id: str) -> RunRow | None:
        return self.runs.get(run_id)

    async def due(self, now_at: str, limit: int, after_id: str | None) -> list[RunRow]:
        rows = sorted(
            (
                row
                for row in self.runs.values()
                if row.status == JobRunStatus.RUNNING
                and (row.next_attempt_at is None or row.next_attempt_at <= now_at)
                and (after_id is None or row.id > after_id)
            ),
            key=lambda row: row.id,
        )
        return rows[:limit]

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        wanted = {
            name: value
            for name in ("module_id", "job", "instance", "status")
            if (value := getattr(run_filter, name)) is not None
        }
        rows = [
            row
            for row in self.runs.values()
            if all(getattr(row, name) == value for name, value in wanted.items())
        ]
        rows.sort(key=lambda row: row.id, reverse=True)
        return rows[: run_filter.limit]

    async def patch(self, run_id: str, patch: RunPatch) -> None:
        if run_id in self.runs:
            row = self.runs[run_id]
            self.runs[run_id] = replace(
                row,
                status=patch.status,
                cursor=patch.cursor,
                counters=patch.counters,
                attempts=patch.attempts,
                last_error=patch.last_error,
                updated_at=patch.updated_at,
                next_attempt_at=patch.next_attempt_at,
                ended_at=patch.ended_at,
            )

    async def commit_pass(self, run_id: str, patch: RunPatch) -> None:
        await self.patch(run_id, patch)
        self.ledgers.pop(run_id, None)

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        return {name: row for name, (row, _at) in self.ledgers.get(run_id, {}).items()}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str) -> None:
        self.ledgers.setdefault(run_id, {})[row.step] = (row, recorded_at)
