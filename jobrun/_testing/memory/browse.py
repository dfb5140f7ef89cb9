"""The browse facet of the memory store: the operator's listing and the console's reads,
by the rules of :mod:`jobrun._core.operator.browse`.
"""

from __future__ import annotations

import builtins
from dataclasses import replace

from jobrun._core import (
    ActivityQuery,
    Counts,
    JobLoad,
    PresenceSeen,
    RunFilter,
    RunQuery,
    RunRow,
    count_activity,
    is_cancelled,
    is_due,
    is_failed_since,
    is_live,
    is_paused,
    is_stranded,
    run_matches,
    waiting_since,
)
from jobrun._testing.memory.base import MemoryStoreBase


class MemoryBrowse(MemoryStoreBase):
    """The listing, a page of runs, a capped count, each job's load, the activity
    chart; no presences."""

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        wanted = {
            name: value
            for name in ("module_id", "job", "instance", "status")
            if (value := getattr(run_filter, name)) is not None
        }
        cancelled, paused = run_filter.cancelled, run_filter.paused
        rows = [
            row
            for row in self.runs.values()
            if all(getattr(row, name) == value for name, value in wanted.items())
            and (cancelled is None or is_cancelled(row) == cancelled)
            and (paused is None or is_paused(row) == paused)
        ]
        rows.sort(key=lambda row: row.id, reverse=True)
        return rows[: run_filter.limit]

    async def find(self, query: RunQuery) -> builtins.list[RunRow]:
        rows = sorted(
            (row for row in self.runs.values() if run_matches(row, query)),
            key=lambda row: row.id,
            reverse=True,
        )
        return rows[: query.limit]

    async def count(self, query: RunQuery, cap: int) -> int:
        return min(cap, sum(1 for row in self.runs.values() if run_matches(row, query)))

    async def job_loads(self, now_at: str, failed_since_at: str) -> builtins.list[JobLoad]:
        loads: dict[tuple[str, str], JobLoad] = {}
        for row in self.runs.values():
            running = is_live(row)
            failed = is_failed_since(row, failed_since_at)
            if not (running or failed):
                continue
            due = is_due(row, now_at)
            key = (row.module_id, row.job)
            load = loads.get(key) or JobLoad(row.module_id, row.job, 0, 0, None, 0, 0)
            oldest = load.oldest_due_at
            if due:
                oldest = min(oldest or waiting_since(row), waiting_since(row))
            loads[key] = replace(
                load,
                running=load.running + running,
                due=load.due + due,
                oldest_due_at=oldest,
                stranded=load.stranded + is_stranded(row, now_at),
                failed_recently=load.failed_recently + failed,
            )
        return [loads[key] for key in sorted(loads)]

    async def activity(self, query: ActivityQuery) -> dict[str, Counts]:
        return count_activity(self.runs.values(), query)

    async def live_presences(self) -> builtins.list[PresenceSeen]:
        return []
