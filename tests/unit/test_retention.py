"""Retention: ``prune_after`` checked, pruning in short batches, totals over every job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.retention import RETENTION_BATCH, check_prune_after, prune_by_retention
from jobrun._entry import SYSTEM_SOURCES
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import done_at_once


def test_a_retention_is_a_positive_timedelta_or_none() -> None:
    assert check_prune_after(None) is None
    assert check_prune_after(timedelta(seconds=1)) == timedelta(seconds=1)
    with pytest.raises(ValueError, match=r"^prune_after must be positive, got 0:00:00$"):
        check_prune_after(timedelta(0))
    with pytest.raises(ValueError, match="prune_after must be positive"):
        check_prune_after(timedelta(seconds=-1))
    with pytest.raises(TypeError, match=r"^prune_after must be a timedelta or None, got int$"):
        check_prune_after(7)


class _PruneRecorder(MemoryJobRunStore):
    """A memory store that writes down the batch size of each prune."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    async def prune(
        self, ended_before: str, statuses: tuple[str, ...], batch_size: int, **kw: Any
    ) -> int:
        self.batch_sizes.append(batch_size)
        return await super().prune(ended_before, statuses, batch_size, **kw)


@pytest.mark.parametrize(("given", "used"), [({}, RETENTION_BATCH), ({"batch_size": 7}, 7)])
async def test_retention_deletes_in_short_batches(given: dict[str, int], used: int) -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "kept", done_at_once, keep_for=timedelta(days=1))
    store = _PruneRecorder()
    deleted = await prune_by_retention(
        store,
        registry,
        prune_after=timedelta(days=7),
        clock=FakeClock(),
        sources=SYSTEM_SOURCES,
        **given,
    )
    assert (deleted, store.batch_sizes) == (0, [used, used])


async def test_retention_counts_the_runs_of_every_job_it_pruned() -> None:
    clock, store, registry = FakeClock(), MemoryJobRunStore(), jobrun.JobRegistry()
    for job in ("a", "b"):
        registry.register("m", job, done_at_once, keep_for=timedelta(hours=1))
        await jobrun.start_job_run(store, module_id="m", job=job, instance="i", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    later = clock.now() + timedelta(hours=2)
    pruned = await prune_by_retention(
        store, registry, prune_after=None, clock=lambda: later, sources=SYSTEM_SOURCES
    )
    assert pruned == 2
    assert await jobrun.job_runs(store) == []
