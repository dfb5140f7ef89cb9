"""The operator's read: ``job_runs`` (filtered, newest first, clamped) and ``get_job_run``.

A corrupt row must never make the read fail: the record comes back with fallbacks
and ``decode_error`` says which column (payload, then cursor, then counters).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import hand_made_row, put_rows, registry_for, set_columns, start

# --- helpers -----------------------------------------------------------------------------


async def put_many(store: Any, engine: AsyncEngine | None, count: int) -> list[str]:
    """``count`` running rows with ids in ascending order; returns the ids."""
    rows = [
        hand_made_row(n, module_id="bulk", job="load", at="2026-01-01T00:00:00.000Z")
        for n in range(count)
    ]
    await put_rows(store, engine, rows)
    return [row.id for row in rows]


def is_utc(moment: Any) -> bool:
    return isinstance(moment, datetime) and moment.utcoffset() == timedelta(0)


# --- order and filters ---------------------------------------------------------------------


async def test_newest_run_first(store, clock):
    runs = [await start(store, clock, instance=str(n)) for n in range(5)]

    listed = await jobrun.job_runs(store)

    assert [run.id for run in listed] == [run.id for run in reversed(runs)]
    assert listed[0] == runs[-1]


async def test_equality_filters_narrow_and_combine(store, clock):
    registry = jobrun.JobRegistry()
    registry.register("crm", "export", lambda p: jobrun.PassResult(done=True))
    a = await start(store, clock, instance="x")
    b = await start(store, clock, instance="y")
    c = await start(store, clock, job="export", instance="x")
    d = await start(store, clock, module_id="billing", instance="x")
    await jobrun.run_due_jobs(store, registry, clock=clock)  # c is now done

    async def ids(**filters: Any) -> list[str]:
        return [run.id for run in await jobrun.job_runs(store, **filters)]

    assert await ids() == [d.id, c.id, b.id, a.id]
    assert await ids(module_id="crm") == [c.id, b.id, a.id]
    assert await ids(job="import") == [d.id, b.id, a.id]
    assert await ids(instance="x") == [d.id, c.id, a.id]
    assert await ids(status="done") == [c.id]
    assert await ids(status=jobrun.JobRunStatus.RUNNING) == [d.id, b.id, a.id]
    assert await ids(status="failed") == []
    assert await ids(module_id="crm", instance="x") == [c.id, a.id]
    assert await ids(module_id="crm", job="import", instance="x", status="running") == [a.id]
    assert await ids(module_id="crm", job="export", status="running") == []
    assert await ids(module_id="nobody") == []
    # Equality, not prefix or pattern matching.
    assert await ids(module_id="cr") == []
    assert await ids(instance="X") == []


async def test_cancelled_runs_are_listed_and_counted_by_the_one_rule(store, clock):
    def fail(_: Any) -> jobrun.PassResult:
        raise ValueError("broken")

    cancelled = await start(store, clock, instance="cancelled")
    await jobrun.cancel_job_run(store, cancelled.id, "not wanted", clock=clock)
    failed = await start(store, clock, instance="failed")
    await jobrun.run_due_jobs(store, registry_for(fail, jobrun.RetryPolicy(1)), clock=clock)
    running = await start(store, clock, instance="running")

    async def ids(status: str) -> list[str]:
        return [run.id for run in await jobrun.job_runs(store, status=status)]

    # failed is the stored status (cancelled ones included); cancelled only them.
    assert await ids("cancelled") == [cancelled.id]
    assert await ids("failed") == [failed.id, cancelled.id]
    assert await ids("running") == [running.id]
    outcomes = {run.id: run.outcome for run in await jobrun.job_runs(store)}
    assert outcomes == {cancelled.id: "cancelled", failed.id: "failed", running.id: "running"}
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.failed, health.cancelled, health.running) == (2, 1, 1)
    # A resume clears the marker: the run is running again, and counted so.
    await jobrun.resume_job_run(store, cancelled.id, clock=clock)
    assert await ids("cancelled") == []
    assert (await jobrun.job_run_health(store, clock=clock)).cancelled == 0


@pytest.mark.parametrize("status", ["sleeping", "RUNNING", "", "done "])
async def test_an_unknown_status_filter_is_refused(store, clock, status):
    await start(store, clock)

    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.job_runs(store, status=status)

    assert caught.value.code == "validation_failed"
    assert repr(status) in str(caught.value)
    assert [error["path"] for error in caught.value.errors] == ["status"]


@pytest.mark.parametrize("argument", ["module_id", "job", "instance"])
async def test_key_filters_must_be_strings(store, argument):
    with pytest.raises(TypeError, match=argument):
        await jobrun.job_runs(store, **{argument: 7})


# --- the limit clamp -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, 50),
        (math.nan, 50),
        (math.inf, 50),
        (-math.inf, 50),
        (-1, 1),
        (0, 1),
        (0.5, 1),
        (-0.5, 1),
        (1, 1),
        (2.7, 2),
        (50, 50),
        (499.9, 499),
        (500, 500),
        (500.9, 500),
        (501, 500),
        (10**6, 500),
        (10**100, 500),
    ],
)
def test_job_run_list_limit_clamps(given, expected):
    result = jobrun.job_run_list_limit(given)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    ("limit", "count"),
    [(None, 4), (math.nan, 4), (2.7, 2), (0, 1), (-1, 1), (1, 1), (4, 4), (10**6, 4)],
)
async def test_job_runs_honours_the_clamped_limit(store, clock, limit, count):
    runs = [await start(store, clock, instance=str(n)) for n in range(4)]

    listed = await jobrun.job_runs(store, limit=limit)

    assert [run.id for run in listed] == [run.id for run in reversed(runs)][:count]


async def test_job_runs_default_and_maximum_page(store, engine):
    ids = await put_many(store, engine, 501)
    newest_first = list(reversed(ids))

    assert [run.id for run in await jobrun.job_runs(store)] == newest_first[:50]
    assert [run.id for run in await jobrun.job_runs(store, limit=math.inf)] == newest_first[:50]
    assert [run.id for run in await jobrun.job_runs(store, limit=10**6)] == newest_first[:500]
    assert len(await jobrun.job_runs(store, limit=500, module_id="bulk")) == 500


# --- get_job_run and the record ------------------------------------------------------------


async def test_get_job_run_of_an_unknown_id_is_none(store, clock):
    await start(store, clock)
    assert await jobrun.get_job_run(store, "01ARZ3NDEKTSV4RRFFQ69G5FAV") is None
    assert await jobrun.get_job_run(store, "") is None


async def test_get_job_run_refuses_a_non_string_id(store):
    with pytest.raises(TypeError, match="run_id"):
        await jobrun.get_job_run(store, 42)


async def test_record_fields_of_running_done_and_failed_runs(store, clock):
    registry = jobrun.JobRegistry()

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("rows", 3)
        if p.run.instance == "broken":
            raise LookupError("no such page")
        return jobrun.PassResult(cursor=[p.run.instance], done=p.run.instance == "finished")

    registry.register(
        "crm", "import", handler, retry=jobrun.RetryPolicy(max_attempts=2, base_delay_ms=2000)
    )
    started = clock()
    finished = await start(store, clock, instance="finished", payload={"k": 1})
    broken = await start(store, clock, instance="broken")
    moving = await start(store, clock, instance="moving")
    clock.advance(seconds=10)
    await jobrun.run_due_jobs(store, registry, clock=clock, random=lambda: 0.5)
    failed_at = clock()

    done = await jobrun.get_job_run(store, finished.id)
    assert isinstance(done, jobrun.JobRun)
    assert done.status == "done"
    assert done.status == jobrun.JobRunStatus.DONE
    assert (done.payload, done.cursor, done.counters) == ({"k": 1}, ["finished"], {"rows": 3})
    assert (done.attempts, done.last_error, done.decode_error) == (0, None, None)
    assert (done.started_at, done.updated_at, done.ended_at) == (started, failed_at, failed_at)
    assert done.next_attempt_at is None

    retrying = await jobrun.get_job_run(store, broken.id)
    assert retrying is not None
    assert retrying.status == "running"
    assert (retrying.cursor, retrying.counters) == (None, {})  # nothing of the failed pass
    assert (retrying.attempts, retrying.last_error) == (1, "LookupError: no such page")
    assert retrying.next_attempt_at == failed_at + timedelta(seconds=2)
    assert retrying.ended_at is None

    clock.advance(seconds=5)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    gave_up = await jobrun.get_job_run(store, broken.id)
    assert gave_up is not None
    assert gave_up.status == "failed"
    assert gave_up.status != "running"
    assert (gave_up.attempts, gave_up.ended_at, gave_up.next_attempt_at) == (2, clock(), None)
    assert gave_up.last_error == "LookupError: no such page"

    advanced = await jobrun.get_job_run(store, moving.id)
    assert advanced is not None
    assert advanced.status == "running"
    assert advanced.cursor == ["moving"]
    assert advanced.counters == {"rows": 6}

    for record in (done, retrying, gave_up, advanced):
        assert (record.module_id, record.job) == ("crm", "import")
        assert is_utc(record.started_at)
        assert is_utc(record.updated_at)
        for optional in (record.next_attempt_at, record.ended_at):
            assert optional is None or is_utc(optional)


async def test_job_run_status_compares_equal_to_plain_strings():
    assert jobrun.JobRunStatus.RUNNING == "running"
    assert jobrun.JobRunStatus.DONE == "done"
    assert jobrun.JobRunStatus.FAILED == "failed"
    assert {str(member) for member in jobrun.JobRunStatus} == {"running", "done", "failed"}


async def test_timestamps_are_aware_utc_and_truncated_to_milliseconds(store):
    clock = FakeClock(datetime(2026, 5, 6, 7, 8, 9, 999_999, tzinfo=UTC))
    run = await start(store, clock)

    [listed] = await jobrun.job_runs(store)

    assert listed.started_at == datetime(2026, 5, 6, 7, 8, 9, 999_000, tzinfo=UTC)
    assert is_utc(listed.started_at)
    assert listed.started_at.tzinfo is not None
    assert listed == run


# --- malformed rows ------------------------------------------------------------------------

FALLBACKS = {"payload": None, "cursor": None, "counters": {}}
GOOD = {"payload": '{"p":1}', "cursor": '{"c":2}', "counters": '{"n":3}'}
DECODED = {"payload": {"p": 1}, "cursor": {"c": 2}, "counters": {"n": 3}}


@pytest.mark.parametrize(
    ("column", "text"),
    [
        ("payload", "not json at all"),
        ("payload", "{'single': 'quotes'}"),
        ("payload", "NaN"),
        ("cursor", "{unclosed"),
        ("cursor", "[1, Infinity]"),
        ("counters", "nope"),
        ("counters", "[1, 2]"),
        ("counters", "7"),
        ("counters", "null"),
        ("counters", '{"n": NaN}'),
        ("counters", '{"n": "3"}'),
        ("counters", '{"n": true}'),
    ],
)
async def test_one_malformed_column_reads_as_its_fallback(store, engine, clock, column, text):
    run = await start(store, clock)
    await set_columns(store, engine, run.id, **{**GOOD, column: text})

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert getattr(record, column) == FALLBACKS[column]
    for other in {"payload", "cursor", "counters"} - {column}:
        assert getattr(record, other) == DECODED[other]
    assert record.decode_error is not None
    assert "JSON" in record.decode_error
    assert column in record.decode_error
    # Everything else is still read from the row.
    assert (record.id, record.status, record.attempts) == (run.id, "running", 0)
    assert record.started_at == run.started_at
    # The listing shows it too, next to its healthy neighbours.
    healthy = await start(store, clock, instance="healthy")
    listed = await jobrun.job_runs(store)
    assert [item.id for item in listed] == [healthy.id, run.id]
    assert listed[1] == record
    assert listed[0].decode_error is None


@pytest.mark.parametrize(
    ("bad_columns", "named"),
    [
        (("payload", "cursor", "counters"), "payload"),
        (("payload", "counters"), "payload"),
        (("cursor", "counters"), "cursor"),
        (("counters", "payload"), "payload"),
    ],
)
async def test_decode_error_names_the_first_bad_column(store, engine, clock, bad_columns, named):
    run = await start(store, clock)
    await set_columns(store, engine, run.id, **{**GOOD, **dict.fromkeys(bad_columns, "#bad")})

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert record.decode_error is not None
    assert "JSON" in record.decode_error
    assert record.decode_error.startswith(named)
    for column in ("payload", "cursor", "counters"):
        expected = FALLBACKS[column] if column in bad_columns else DECODED[column]
        assert getattr(record, column) == expected


async def test_sql_null_cursor_is_none_without_a_decode_error(store, engine, clock):
    run = await start(store, clock)
    await set_columns(store, engine, run.id, cursor="null")
    committed_null = await jobrun.get_job_run(store, run.id)
    assert committed_null is not None
    assert (committed_null.cursor, committed_null.decode_error) == (None, None)
    assert (await store.get(run.id)).cursor == "null"


async def test_an_unknown_status_is_shown_as_stored(store, engine, clock):
    run = await start(store, clock, payload={"p": 1})
    other = await start(store, clock, instance="other")
    await set_columns(store, engine, run.id, status="paused")

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert record.status == "paused"
    assert record.payload == {"p": 1}
    assert record.decode_error is not None
    assert "paused" in record.decode_error
    assert [item.id for item in await jobrun.job_runs(store)] == [other.id, run.id]
    assert [item.id for item in await jobrun.job_runs(store, status="running")] == [other.id]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T01:30:00+01:00", datetime(2026, 1, 1, 0, 30, tzinfo=UTC)),
        ("2026-01-01T00:30:00Z", datetime(2026, 1, 1, 0, 30, tzinfo=UTC)),
        ("2026-01-01 00:30:00", datetime(2026, 1, 1, 0, 30, tzinfo=UTC)),
        ("2026-01-01T00:30:00.123456+00:00", datetime(2026, 1, 1, 0, 30, 0, 123456, tzinfo=UTC)),
    ],
)
async def test_timestamps_in_another_iso_form_are_read_as_utc(store, engine, clock, text, expected):
    run = await start(store, clock)
    await set_columns(store, engine, run.id, started_at=text, updated_at=text, next_attempt_at=text)

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert record.started_at == record.updated_at == record.next_attempt_at == expected
    assert is_utc(record.started_at)
    assert is_utc(record.next_attempt_at)
    assert record.decode_error is None


async def test_a_timestamp_that_is_not_one_leaves_the_record_readable(store, engine, clock):
    run = await start(store, clock, payload="p")
    await set_columns(store, engine, run.id, updated_at="yesterday-ish")

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert record.payload == "p"
    assert record.started_at == run.started_at
    assert isinstance(record.updated_at, datetime)
    assert record.decode_error is not None
    assert "updated_at" in record.decode_error
    assert len(await jobrun.job_runs(store)) == 1


async def test_a_json_problem_is_reported_before_a_timestamp_problem(store, engine, clock):
    run = await start(store, clock)
    await set_columns(store, engine, run.id, started_at="garbage", counters="{")

    record = await jobrun.get_job_run(store, run.id)

    assert record is not None
    assert record.decode_error is not None
    assert record.decode_error.startswith("counters")
    assert "JSON" in record.decode_error


@pytest.mark.parametrize("limit", ["5", [5], True])
async def test_a_list_limit_that_is_no_number_is_named_by_its_type(limit: object) -> None:
    with pytest.raises(
        TypeError, match=f"^limit must be a number or None, got {type(limit).__name__}$"
    ):
        await jobrun.job_runs(MemoryJobRunStore(), limit=limit)  # type: ignore[arg-type]


async def test_a_run_id_that_is_no_str_is_named_by_its_type() -> None:
    with pytest.raises(TypeError, match=r"^run_id must be a str, got int$"):
        await jobrun.get_job_run(MemoryJobRunStore(), 5)  # type: ignore[arg-type]


async def test_an_unknown_status_filter_lists_the_statuses() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.job_runs(MemoryJobRunStore(), status="sleeping")
    assert str(caught.value) == (
        "status filter 'sleeping' is not one of running, done, failed, cancelled, paused"
    )
    assert caught.value.errors == [{"path": "status", "message": "'sleeping' is not a run status"}]


@pytest.mark.parametrize("argument", ["module_id", "job", "instance"])
async def test_a_key_filter_that_is_no_str_is_named_with_its_type(argument: str) -> None:
    with pytest.raises(TypeError, match=f"^{argument} filter must be a str or None, got int$"):
        await jobrun.job_runs(MemoryJobRunStore(), **{argument: 5})  # type: ignore[arg-type]
