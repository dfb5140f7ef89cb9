"""The console's store reads (find, count, job_loads) on memory, SQLite and Postgres."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from jobrun._core.model.formats import format_instant
from jobrun._core.model.ids import first_id_at
from jobrun._core.model.records import JOB_RUN_LIST_MAX
from jobrun._core.operator.browse import JobLoad, RunQuery
from jobrun.sql.store.browse import _prefix_successor
from tests.support import (
    SQL_BACKENDS,
    StatementLog,
    hand_made_row,
    logged_store,
    put_rows,
    query_plan,
)

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
    # Run 2 has a real id, minted as it started; the others' ids predate every ULID.
    second = first_id_at("2026-01-01T10:00:00.000Z")[:-1] + "2"
    await put_rows(
        store,
        engine,
        [
            _row(1, instance="Shop-1", status="failed"),
            _row(
                2,
                id=second,
                instance="shop-10",
                status="done",
                started_at="2026-01-01T10:00:00.000Z",
            ),
            _row(3, instance="shop%", status="running"),
            _row(4, instance="shop-2", job="other"),
            _row(5, instance="x", module_id="crm"),
        ],
    )
    assert await _ids(store, module_id="crm") == [f"{5:026d}"]
    assert await _ids(store, module_id="shop", job="other") == [f"{4:026d}"]
    # A prefix is exact: case counts, and % is an ordinary character.
    assert await _ids(store, instance_prefix="shop-1") == [second]
    assert await _ids(store, instance_prefix="shop%") == [f"{3:026d}"]
    assert await _ids(store, statuses=("failed", "done")) == [second, f"{1:026d}"]
    assert await _ids(store, started_since_at="2026-01-01T00:00:00.000Z") == [second]
    # Started since is also "minted since": a run's id is the instant it started.
    assert await _ids(store, started_since_at="2026-01-01T10:00:00.001Z") == []


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
            _row(5, next_attempt_at=NOW, **leased),  # expired at this very instant: due
        ],
    )
    assert await _ids(store, stranded_at=NOW) == [f"{5:026d}", f"{1:026d}"]
    assert await store.count(RunQuery(stranded_at=NOW), 100) == 2


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
            # Never claimed: last written as they started (waiting since then).
            _row(1, started_at="2026-01-01T11:00:00.000Z", updated_at="2026-01-01T11:00:00.000Z"),
            _row(2, started_at="2026-01-01T11:30:00.000Z", updated_at="2026-01-01T11:30:00.000Z"),
            _row(3, next_attempt_at="2026-01-01T11:59:00.000Z", **leased),  # stranded, so due
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
            due=3,
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


async def _plans(engine: Any, log: StatementLog, read: Any) -> list[str]:
    """The plan of each statement ``read`` sends through a store logged by ``log``
    (Postgres: with sequential scans off, so a few thousand rows still show which index
    fits)."""
    log.seen.clear()
    await read()
    sent = [(statement, tuple(parameters)) for _, statement, parameters in log.seen]
    plans = []
    async with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            await connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for statement, parameters in sent:
            if "_substrat_job_runs" in statement and "alembic" not in statement:
                plans.append(await query_plan(connection, statement, parameters))
    return plans


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_pages_and_counts_seek_an_index_in_id_order(store: Any, engine: Any) -> None:
    """A job's page, its counts per status and "started since" read id-ordered index
    ranges: no full scan, no sort of the matching rows (the merge sorts a page's few)."""
    # Runs 1 ms apart from 2026-09-21T14:13:20Z, ids minted as they started.
    started = [
        format_instant(datetime.fromtimestamp((1_790_000_000_000 + index) / 1000, UTC))
        for index in range(4001)
    ]
    rows = [
        _row(
            index,
            id=first_id_at(started[index])[:-6] + f"{index:06d}",
            started_at=started[index],
            job=f"job-{index % 4}",
            instance=f"i{index}",
            status=("done", "failed", "running")[min(index % 50, 2)],
        )
        for index in range(1, 4001)
    ]
    await put_rows(store, engine, rows)
    if engine.dialect.name == "postgresql":
        async with engine.begin() as connection:
            await connection.exec_driver_sql("ANALYZE _substrat_job_runs")
    job = {"module_id": "shop", "job": "job-1"}
    since = "2026-09-21T14:13:22.000Z"
    logged, log = logged_store(engine)
    page = await _plans(engine, log, lambda: logged.find(RunQuery(**job, limit=51)))
    counts = await _plans(
        engine, log, lambda: logged.count(RunQuery(**job, statuses=("done",)), 100)
    )
    recent = await _plans(
        engine,
        log,
        lambda: logged.count(RunQuery(statuses=("failed",), started_since_at=since), 100),
    )
    assert len(page) == len(counts) == len(recent) == 1
    # The last 2 s of the 4 hold 40 failed runs (index % 50 == 1, index >= 2000).
    assert await store.count(RunQuery(statuses=("failed",), started_since_at=since), 100) == 40
    if engine.dialect.name == "sqlite":
        arm = "USING INDEX _substrat_job_runs_job_status (module_id=? AND job=? AND status=?)"
        assert page[0].count(arm) == 3, page[0]
        assert "SCAN _substrat_job_runs" not in page[0], page[0]
        assert (
            "COVERING INDEX _substrat_job_runs_job_status (module_id=? AND job=? AND status=?)"
            in counts[0]
        )
        assert "_substrat_job_runs_status (status=? AND id>?)" in recent[0], recent[0]
    else:
        assert page[0].count("Index Scan Backward using _substrat_job_runs_job_status") == 3
        assert "Merge Append" in page[0], page[0]
        assert not re.search(r"(^|->\s+)Sort\s+\(", page[0], re.MULTILINE), page[0]
        assert "_substrat_job_runs_job_status" in counts[0], counts[0]
        assert re.search(r"Index Cond: .*status = 'failed'.*id >= ", recent[0]), recent[0]


@pytest.mark.parametrize(
    ("prefix", "successor"),
    [
        ("ab", "ac"),
        ("a\U0010ffff", "b"),
        ("a\ud7ff", "a\ue000"),
        ("\U0010ffff\U0010ffff", None),
        ("", None),
    ],
    ids=["last-character", "carry", "over-the-surrogates", "none-above", "empty"],
)
def test_the_successor_of_a_prefix_is_the_least_string_above_its_range(
    prefix: str, successor: str | None
) -> None:
    assert _prefix_successor(prefix) == successor


@pytest.mark.parametrize("limit", [1, JOB_RUN_LIST_MAX])
def test_a_console_query_takes_any_limit_from_one_to_the_list_maximum(limit: int) -> None:
    assert RunQuery(limit=limit).limit == limit
    with pytest.raises(ValueError, match=rf"^limit must be in \[1, {JOB_RUN_LIST_MAX}\], got 0$"):
        RunQuery(limit=0)
