"""Retention: ``prune_after`` checked, pruning in short batches, totals over every job,
whose runs are whose."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import jobrun
from jobrun._api import SYSTEM_SOURCES
from jobrun._core.operator.retention import RETENTION_BATCH, check_prune_after, prune_by_retention
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
    registry.register("m", "plain", done_at_once)
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


async def _finished_runs(
    store: MemoryJobRunStore, clock: FakeClock, *jobs: tuple[str, str]
) -> None:
    registry = jobrun.JobRegistry()
    for module_id, job in jobs:
        registry.register(module_id, job, done_at_once)
        await jobrun.start_job_run(store, module_id=module_id, job=job, instance="i", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)


async def test_a_worker_prunes_only_the_jobs_it_registers_unless_told() -> None:
    """Issue 23 item 7: another app's runs are not this worker's to delete."""
    clock, store = FakeClock(), MemoryJobRunStore()
    billing = jobrun.JobRegistry()
    billing.register("billing", "invoice", done_at_once, keep_for=timedelta(days=365))
    ours = jobrun.JobRegistry()
    ours.register("shop", "sync", done_at_once)
    await _finished_runs(store, clock, ("billing", "invoice"), ("shop", "sync"), ("gone", "old"))
    later = clock.now() + timedelta(days=40)

    async def prune(registry: jobrun.JobRegistry, **options: Any) -> int:
        return await prune_by_retention(
            store, registry, clock=lambda: later, sources=SYSTEM_SOURCES, **options
        )

    # The billing app's worker records its job's keep_for (and deletes nothing yet).
    assert await prune(billing, prune_after=None) == 0
    assert store.retention == {("billing", "invoice"): 365 * 86400}
    # Ours, with prune_after 30 days: only its own job's run goes.
    assert await prune(ours, prune_after=timedelta(days=30)) == 1
    assert sorted(run.job for run in await jobrun.job_runs(store)) == ["invoice", "old"]
    # Told to prune unregistered jobs too: the job nobody registers goes; billing's
    # run is younger than its own recorded keep_for and stays.
    assert await prune(ours, prune_after=None, prune_unregistered_after=timedelta(days=30)) == 1
    assert [run.job for run in await jobrun.job_runs(store)] == ["invoice"]
    # Past its keep_for, an unregistered prune may delete it.
    much_later = later + timedelta(days=400)
    assert (
        await prune_by_retention(
            store,
            ours,
            prune_after=None,
            prune_unregistered_after=timedelta(days=30),
            clock=lambda: much_later,
            sources=SYSTEM_SOURCES,
        )
        == 1
    )


async def test_a_job_registered_without_keep_for_loses_its_record() -> None:
    store = MemoryJobRunStore()
    registry = jobrun.JobRegistry()
    registry.register("m", "j", done_at_once, keep_for=timedelta(hours=1, milliseconds=1))
    await prune_by_retention(
        store, registry, prune_after=None, clock=FakeClock(), sources=SYSTEM_SOURCES
    )
    assert store.retention == {("m", "j"): 3601}  # rounded up: never keeps less
    again = jobrun.JobRegistry()
    again.register("m", "j", done_at_once)
    await prune_by_retention(
        store, again, prune_after=None, clock=FakeClock(), sources=SYSTEM_SOURCES
    )
    assert store.retention == {}


def test_prune_unregistered_after_is_checked_under_its_own_name() -> None:
    with pytest.raises(ValueError, match=r"^prune_unregistered_after must be positive"):
        check_prune_after(timedelta(0), "prune_unregistered_after")
