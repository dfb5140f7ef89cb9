"""The console's store reads (find, count, job_loads) on memory, SQLite and Postgres."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobrun._core.browse import JobLoad, RunQuery
from tests.support import hand_made_row, put_rows

NOW = "2026-01-01T12:00:00.000Z"


def _row(index: int, **values: Any) -> Any:
    return dataclasses.replace(hand_made_row(index, module_id="shop", job="sync"), **values)


async def _ids(store: Any, **query: Any) -> list[str]:
    return [row.id for row in await store.find(RunQuery(**query))]


async def test_find_is_newest_first_and_pages_by_keyset(store: Any, engine: Any) -> None:
    await put_rows(store, engine, [_row(index, status="done") for index in range(1, 8)])
    first = await _ids(store, limit=3)
    assert first == [f"{index:026d}" for index in (7, 6, 5)]
    second = await _ids(store, limit=3, before_id=first[-1])
    assert second == [f"{index:026d}" for index in (4, 3, 2)]
    assert await _ids(store, limit=3, before_id=second[-1]) == [f"{1:026d}"]


async def test_find_filters_by_every_field(store: Any, engine: Any) -> None:
    await put_rows(
        store,
        engine,
        [
            _row(1, instance="Shop-1", status="failed"),
            _row(2, instance="shop-10", status="done", started_at="2026-01-01T10:00:00.000Z"),
            _row(3, instance="shop%", status="running"),
            _row(4, instance="shop-2", job="other"),
            _row(5, instance="x", module_id="crm"),
        ],
    )
    assert await _ids(store, module_id="crm") == [f"{5:026d}"]
    assert await _ids(store, module_id="shop", job="other") == [f"{4:026d}"]
    # A prefix is exact: case counts, and % is an ordinary character.
    assert await _ids(store, instance_prefix="shop-1") == [f"{2:026d}"]
    assert await _ids(store, instance_prefix="shop%") == [f"{3:026d}"]
    assert await _ids(store, statuses=("failed", "done")) == [f"{2:026d}", f"{1:026d}"]
    assert await _ids(store, started_since_at="2026-01-01T00:00:00.000Z") == [f"{2:026d}"]


async def test_stranded_means_leased_with_an_expired_lease(store: Any, engine: Any) -> None:
    leased = {"lease_owner": "token", "lease_driver": "host-1", "lease_began_at": NOW}
    await put_rows(
        store,
        engine,
        [
            _row(1, next_attempt_at="2026-01-01T11:59:59.000Z", **leased),  # stranded
            _row(2, next_attempt_at="2026-01-01T12:00:30.000Z", **leased),  # lease still good
            _row(3, next_attempt_at="2026-01-01T11:00:00.000Z"),  # backing off, not leased
            _row(4, status="failed", next_attempt_at="2026-01-01T11:00:00.000Z", **leased),
        ],
    )
    assert await _ids(store, stranded_at=NOW) == [f"{1:026d}"]
    assert await store.count(RunQuery(stranded_at=NOW), 100) == 1


async def test_count_stops_at_the_cap(store: Any, engine: Any) -> None:
    await put_rows(store, engine, [_row(index, status="done") for index in range(1, 13)])
    assert await store.count(RunQuery(statuses=("done",)), 5) == 5
    assert await store.count(RunQuery(statuses=("done",)), 100) == 12
    assert await store.count(RunQuery(statuses=("failed",)), 100) == 0
    assert await store.count(RunQuery(before_id=f"{4:026d}"), 100) == 3


async def test_job_loads_per_job(store: Any, engine: Any) -> None:
    leased = {"lease_owner": "token", "lease_driver": "host-1", "lease_began_at": NOW}
    await put_rows(
        store,
        engine,
        [
            _row(1, started_at="2026-01-01T11:00:00.000Z"),  # due an hour ago
            _row(2, started_at="2026-01-01T11:30:00.000Z"),  # due
            _row(3, next_attempt_at="2026-01-01T11:59:00.000Z", **leased),  # stranded
            _row(4, status="failed", ended_at="2026-01-01T11:10:00.000Z"),  # failed recently
            _row(5, status="failed", ended_at="2025-12-31T00:00:00.000Z"),  # failed long ago
            _row(6, status="done", job="done-only", ended_at=NOW),
            _row(7, module_id="crm", job="mail", next_attempt_at="2026-01-01T13:00:00.000Z"),
        ],
    )
    loads = await store.job_loads(NOW, "2026-01-01T11:00:00.000Z")
    assert loads == [
        JobLoad("crm", "mail", running=1, due=0, oldest_due_at=None, stranded=0, failed_recently=0),
        JobLoad(
            "shop",
            "sync",
            running=3,
            due=2,
            oldest_due_at="2026-01-01T11:00:00.000Z",
            stranded=1,
            failed_recently=1,
        ),
    ]


def test_a_query_refuses_what_it_cannot_mean() -> None:
    with pytest.raises(ValueError, match="statuses"):
        RunQuery(statuses=("stranded",))
    with pytest.raises(ValueError, match="limit"):
        RunQuery(limit=0)
