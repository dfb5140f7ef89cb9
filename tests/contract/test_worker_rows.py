"""The workers' own rows (revision 0007): written by a heartbeat, refreshed by the next,
deleted at a stop, and taken for gone by readers once their expiry has passed, on
every backend (see ``jobrun._core.operator.worker_registry``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobrun._core.model.formats import format_instant
from jobrun._core.model.worker_rows import WorkerRow, jobs_text
from jobrun._core.operator.worker_registry import beat_row
from jobrun.sql.next_due import sqlite_beat_worker, sqlite_forget_worker
from jobrun.worker.wakeups import sqlite_path

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> str:
    return format_instant(START + timedelta(seconds=seconds))


def _worker(worker_id: str, jobs: list[tuple[str, str]], at_s: float = 0.0) -> WorkerRow:
    blank = WorkerRow(
        worker_id, f"host:{worker_id}", "host", 4242, jobs_text(jobs), _at(at_s), "", ""
    )
    # Heartbeat every 10 s: gone 30 s after its last.
    return beat_row(blank, START + timedelta(seconds=at_s), 10.0)


async def test_a_beat_registers_the_worker_until_its_expiry(store: Any) -> None:
    worker = _worker("w1", [("@shop/orders", "sync"), ("m/j", "x")])
    await store.beat_worker(worker)
    assert await store.live_workers(_at(1)) == [worker]
    assert (await store.live_workers(_at(1)))[0].job_pairs == [
        ("@shop/orders", "sync"),
        ("m/j", "x"),
    ]
    assert await store.live_workers(_at(29.999)) == [worker]
    # Its expiry reached: gone for every reader, though its row is still there.
    assert await store.live_workers(_at(30)) == []


async def test_a_later_beat_refreshes_the_heartbeat_and_jobs_not_the_start(store: Any) -> None:
    first = _worker("w1", [("m", "a")])
    await store.beat_worker(first)
    later = beat_row(
        WorkerRow("w1", "renamed", "elsewhere", 1, jobs_text([("m", "b")]), _at(25), "", ""),
        START + timedelta(seconds=25),
        10.0,
    )
    await store.beat_worker(later)
    [found] = await store.live_workers(_at(40))
    assert (found.name, found.host, found.pid, found.started_at) == (
        "host:w1",
        "host",
        4242,
        _at(0),
    )
    assert (found.heartbeat_at, found.expires_at) == (_at(25), _at(55))
    assert found.job_pairs == [("m", "b")]


async def test_a_stopped_worker_is_forgotten(store: Any) -> None:
    await store.beat_worker(_worker("w1", [("m", "a")]))
    await store.beat_worker(_worker("w2", [("m", "a")]))
    await store.forget_worker("w1")
    await store.forget_worker("no such worker")
    assert [row.id for row in await store.live_workers(_at(1))] == ["w2"]


async def test_a_sweep_deletes_only_the_workers_gone_by_then(store: Any) -> None:
    await store.beat_worker(_worker("old", [("m", "a")], at_s=0))
    await store.beat_worker(_worker("young", [("m", "a")], at_s=20))
    # At 35 s "old" (expired at 30 s) is gone, "young" (until 50 s) is not.
    await store.beat_worker(_worker("new", [("m", "b")], at_s=35), sweep_at=_at(35))
    assert [row.id for row in await store.live_workers(_at(0))] == ["young", "new"]
    # A gone worker that beats again is back (its row written anew).
    await store.beat_worker(_worker("old", [("m", "a")], at_s=36))
    assert [row.id for row in await store.live_workers(_at(36))] == ["young", "new", "old"]


async def test_workers_are_listed_oldest_first(store: Any) -> None:
    for worker_id, at_s in (("b", 2), ("a", 2), ("c", 1)):
        await store.beat_worker(_worker(worker_id, [], at_s=at_s))
    assert [row.id for row in await store.live_workers(_at(3))] == ["c", "a", "b"]


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_worker_writes_its_row_in_a_sqlite_file_as_the_store_would(store: Any) -> None:
    # The worker's registration writes SQLite files through a stdlib connection of
    # its own (no engine opened): the store must read what it wrote, sweep and all.
    path = sqlite_path(store.engine)
    assert path is not None

    async def beat(worker: WorkerRow, sweep_at: str | None = None) -> None:
        await asyncio.to_thread(sqlite_beat_worker, path, worker, sweep_at)

    await beat(_worker("old", [("m", "a")], at_s=0))
    young = _worker("young", [("m", "a")], at_s=20)
    await beat(young)
    await beat(_worker("new", [("m", "b")], at_s=35), sweep_at=_at(35))
    assert [row.id for row in await store.live_workers(_at(0))] == ["young", "new"]
    assert (await store.live_workers(_at(0)))[0] == young
    await asyncio.to_thread(sqlite_forget_worker, path, "young")
    assert [row.id for row in await store.live_workers(_at(0))] == ["new"]
