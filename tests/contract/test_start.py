"""Start and join: ``start_job_run`` coalesces on (module_id, job, instance) while a run is live."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun.sql.schema import job_runs as runs_table
from jobrun.testing import FakeClock
from tests.support import start

ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


async def count_rows(engine: AsyncEngine, *, live_only: bool = False) -> int:
    query = select(func.count()).select_from(runs_table)
    if live_only:
        query = query.where(runs_table.c.status == "running")
    async with engine.connect() as connection:
        return int((await connection.execute(query)).scalar_one())


async def finish(store: Any, clock: FakeClock, *, done: bool) -> None:
    """Drive every due crm/import run to done (or to failed)."""
    registry = jobrun.JobRegistry()

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if not done:
            raise RuntimeError("gave up")
        return jobrun.PassResult(done=True)

    registry.register("crm", "import", handler, retry=jobrun.RetryPolicy(max_attempts=1))
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert report.attempted >= 1


async def test_first_start_creates_a_fresh_running_run(store):
    clock = FakeClock(datetime(2026, 3, 4, 5, 6, 7, 891_234, tzinfo=UTC))
    payload = {"source": "s-1", "pages": [1, 2.5], "label": "Zürich ✓", "flag": True}

    run = await start(store, clock, payload=payload)

    assert ULID.fullmatch(run.id)
    assert (run.module_id, run.job, run.instance) == ("crm", "import", "default")
    assert run.status == "running"
    assert run.payload == payload
    assert run.cursor is None
    assert run.counters == {}
    assert run.attempts == 0
    assert run.last_error is None
    moment = datetime(2026, 3, 4, 5, 6, 7, 891_000, tzinfo=UTC)
    assert run.started_at == moment
    assert run.updated_at == moment
    assert run.next_attempt_at is None
    assert run.ended_at is None
    assert run.decode_error is None
    assert await jobrun.get_job_run(store, run.id) == run

    row = await store.get(run.id)
    assert row.payload == '{"source":"s-1","pages":[1,2.5],"label":"Zürich ✓","flag":true}'
    assert row.cursor is None  # SQL NULL: no pass has committed yet
    assert row.counters == "{}"
    assert row.started_at == row.updated_at == "2026-03-04T05:06:07.891Z"


async def test_second_start_joins_the_live_run_and_keeps_the_first_payload(store, clock):
    first = await start(store, clock, payload={"wave": 1})
    clock.advance(seconds=30)

    second = await start(store, clock, payload={"wave": 2})

    assert second.id == first.id
    assert second.payload == {"wave": 1}
    assert second == first  # nothing about the live run changed, not even updated_at
    assert len(await jobrun.job_runs(store)) == 1


async def test_join_returns_the_live_run_as_it_is_now(store, clock):
    registry = jobrun.JobRegistry()
    registry.register("crm", "import", lambda p: jobrun.PassResult(cursor={"page": 3}))
    first = await start(store, clock, payload="p")
    await jobrun.run_due_jobs(store, registry, clock=clock)

    joined = await start(store, clock, payload="other")

    assert joined.id == first.id
    assert (joined.payload, joined.cursor, joined.status) == ("p", {"page": 3}, "running")


async def test_instance_is_part_of_the_key_and_empty_is_not_default(store, clock):
    default = await start(store, clock)
    explicit_default = await start(store, clock, instance="default")
    empty = await start(store, clock, instance="")
    other = await start(store, clock, instance="source-7")
    empty_again = await start(store, clock, instance="")

    assert default.instance == "default"
    assert explicit_default.id == default.id
    assert empty.instance == ""
    assert len({default.id, empty.id, other.id}) == 3
    assert empty_again.id == empty.id
    assert {run.instance for run in await jobrun.job_runs(store)} == {"default", "", "source-7"}
    [only_empty] = await jobrun.job_runs(store, instance="")
    assert only_empty.id == empty.id


async def test_module_and_job_are_part_of_the_key(store, clock):
    base = await start(store, clock)
    other_job = await start(store, clock, job="export")
    other_module = await start(store, clock, module_id="billing")
    # The key is a triple, not a joined string.
    slash_one = await start(store, clock, module_id="a/b", job="c")
    slash_two = await start(store, clock, module_id="a", job="b/c")

    ids = [base.id, other_job.id, other_module.id, slash_one.id, slash_two.id]
    assert len(set(ids)) == 5


@pytest.mark.parametrize("done", [True, False], ids=["after-done", "after-failed"])
async def test_a_finished_run_never_blocks_a_new_one(store, clock, done):
    first = await start(store, clock, payload=1)
    await finish(store, clock, done=done)
    ended = await jobrun.get_job_run(store, first.id)
    assert ended is not None
    assert ended.status == ("done" if done else "failed")

    second = await start(store, clock, payload=2)

    assert second.id != first.id
    assert second.id > first.id
    assert (second.status, second.payload, second.cursor, second.attempts) == (
        "running",
        2,
        None,
        0,
    )
    assert [run.id for run in await jobrun.job_runs(store)] == [second.id, first.id]
    # The finished run is kept as it was.
    assert await jobrun.get_job_run(store, first.id) == ended
    # And the new run is the one a further start joins.
    assert (await start(store, clock, payload=3)).id == second.id


@pytest.mark.parametrize("how", ["omitted", "none"])
async def test_a_missing_payload_is_stored_as_json_null(store, clock, how):
    run = await (start(store, clock) if how == "omitted" else start(store, clock, payload=None))

    assert run.payload is None
    row = await store.get(run.id)
    assert row.payload == "null"


async def test_concurrent_starts_on_one_key_make_one_run(store, engine, clock):
    runs = await asyncio.gather(*(start(store, clock, payload={"caller": n}) for n in range(20)))

    assert len({run.id for run in runs}) == 1
    winner = runs[0].payload
    assert winner in [{"caller": n} for n in range(20)]
    assert all(run.payload == winner for run in runs)
    # One caller made it, whether in one batch or several: every other one joined.
    assert sorted(run.joined for run in runs) == [False] + [True] * 19
    assert len(await jobrun.job_runs(store)) == 1
    assert len(await jobrun.job_runs(store, status="running")) == 1
    if engine is not None:
        assert await count_rows(engine) == 1
        assert await count_rows(engine, live_only=True) == 1


async def test_concurrent_starts_on_several_keys_make_one_run_per_key(store, engine, clock):
    keys = [f"source-{n}" for n in range(5)]
    runs = await asyncio.gather(
        *(start(store, clock, instance=key, payload=round_) for round_ in range(4) for key in keys)
    )

    by_key: dict[str, set[str]] = {}
    for run in runs:
        by_key.setdefault(run.instance, set()).add(run.id)
    assert {key: len(ids) for key, ids in by_key.items()} == dict.fromkeys(keys, 1)
    assert len(await jobrun.job_runs(store)) == 5
    if engine is not None:
        assert await count_rows(engine, live_only=True) == 5


async def test_start_does_not_need_the_job_to_be_registered(store, clock):
    run = await start(store, clock, module_id="nobody", job="knows-me")

    report = await jobrun.run_due_jobs(store, jobrun.JobRegistry(), clock=clock)

    assert report.attempted == 0
    still = await jobrun.get_job_run(store, run.id)
    assert still == run


async def test_ids_sort_in_start_order(store, clock):
    runs = [await start(store, clock, instance=str(n)) for n in range(30)]
    ids = [run.id for run in runs]
    assert ids == sorted(ids)
    assert len(set(ids)) == 30
