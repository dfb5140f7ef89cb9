"""The operator read never raises for what is stored: a property test on both dialects.

Hypothesis writes arbitrary values behind jobrun's back into every column of one
run row but its id (the key the read looks up): text of any shape, timestamps
out of range or with odd offsets, JSON that is invalid or not portable, and on
SQLite any type the column's affinity keeps (blobs, numbers in integer columns,
text in integer columns). ``get_job_run`` and ``job_runs`` must read the row
back every time, naming what they could not decode instead of raising.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from jobrun.sql.schema import job_runs as runs_table
from tests.support import SQL_BACKENDS

TEXT_COLUMNS = ["module_id", "job", "instance", "status", "payload", "counters", "started_at"]
TEXT_COLUMNS += ["updated_at"]
NULLABLE_TEXT_COLUMNS = ["cursor", "last_error", "next_attempt_at", "ended_at"]
NULLABLE_TEXT_COLUMNS += ["lease_owner", "lease_driver", "lease_began_at"]
INTEGER_COLUMNS = ["attempts", "lease_takeovers"]

EDGE_TEXTS = [
    "",
    "9999-12-31T23:00:00-05:00",
    "9999-12-31T23:59:59.999+00:00",
    "0001-01-01T00:30:00+01:00",
    "0001-01-01T00:00:00.000Z",
    "2026-01-01T00:00:00+23:59:59.999999",
    "2026-02-30T00:00:00Z",
    "2026-01-01",
    "NaN",
    "Infinity",
    "1e999",
    "-1e999",
    "[" * 100_000,
    '{"n": NaN}',
    '{"n": true}',
    "[1,2",
    "null",
    '"\\ud800"',
    "running",
    "done",
]


def _offsets() -> st.SearchStrategy[timezone]:
    return st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
        lambda minutes: timezone(timedelta(minutes=minutes))
    )


def _timestamp_texts() -> st.SearchStrategy[str]:
    """ISO forms Python reads, from year 1 to 9999, at any whole-minute offset."""
    moments = st.datetimes(
        min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
    )
    return st.one_of(
        st.builds(
            lambda moment, zone: moment.replace(tzinfo=zone).isoformat(), moments, _offsets()
        ),
        moments.map(lambda moment: moment.isoformat()),
        moments.map(lambda moment: moment.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")),
    )


def _json_texts() -> st.SearchStrategy[str]:
    import json

    leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    values = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=4), children, max_size=3)
        ),
        max_leaves=8,
    )
    return values.map(lambda value: json.dumps(value, allow_nan=True))


def any_text(dialect: str) -> st.SearchStrategy[Any]:
    texts = st.one_of(
        st.sampled_from(EDGE_TEXTS), _timestamp_texts(), _json_texts(), st.text(max_size=40)
    )
    if dialect == "postgres":
        # Postgres text cannot hold NUL.
        return texts.map(lambda text: text.replace("\x00", ""))
    # A TEXT column on SQLite keeps blobs as blobs (numbers turn into text).
    return (
        texts
        | st.binary(max_size=16)
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False)
    )


def any_integer(dialect: str) -> st.SearchStrategy[Any]:
    if dialect == "postgres":
        return st.integers(-(2**31), 2**31 - 1)
    # An INTEGER column on SQLite keeps text that is not a number, reals and blobs.
    return st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10) | st.floats(allow_nan=False)


def any_row(dialect: str) -> st.SearchStrategy[dict[str, Any]]:
    text = any_text(dialect)
    columns: dict[str, st.SearchStrategy[Any]] = dict.fromkeys(TEXT_COLUMNS, text)
    columns |= dict.fromkeys(NULLABLE_TEXT_COLUMNS, st.none() | text)
    columns |= dict.fromkeys(INTEGER_COLUMNS, any_integer(dialect))
    return st.fixed_dictionaries(columns)


PLAIN_ROW: dict[str, Any] = dict.fromkeys(TEXT_COLUMNS, "x") | dict.fromkeys(NULLABLE_TEXT_COLUMNS)
PLAIN_ROW |= dict.fromkeys(INTEGER_COLUMNS, 0)
TIMESTAMP_COLUMNS = ["started_at", "updated_at", "next_attempt_at", "ended_at"]
# Valid ISO text whose instant in UTC falls outside years 1-9999 (once an OverflowError).
OUT_OF_RANGE = [
    PLAIN_ROW | {column: text}
    for column in TIMESTAMP_COLUMNS
    for text in ("9999-12-31T23:00:00-05:00", "0001-01-01T00:30:00+01:00")
]


def _examples(rows: list[dict[str, Any]]) -> Any:
    def add(test: Any) -> Any:
        for row in rows:
            test = example(values=row)(test)
        return test

    return add


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
def test_any_stored_row_reads_back_without_raising(backend: str, database_url: str) -> None:
    loop = asyncio.new_event_loop()
    engine = create_async_engine(database_url)
    store = jobrun.SqlJobRunStore(engine)
    run_id = loop.run_until_complete(
        jobrun.start_job_run(store, module_id="m", job="j", payload={"k": 1})
    ).id

    async def write_and_read(values: dict[str, Any]) -> None:
        async with engine.begin() as connection:
            statement = update(runs_table).where(runs_table.c.id == run_id).values(**values)
            await connection.execute(statement)
        record = await jobrun.get_job_run(store, run_id)
        assert record is not None
        assert record.id == run_id
        listed = await jobrun.job_runs(store)
        assert [item.id for item in listed] == [run_id]
        assert listed[0] == record
        # What was readable is shown as stored; the first problem is named.
        assert record.started_at.tzinfo is not None
        assert record.updated_at.tzinfo is not None

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(values=any_row(backend))
    @_examples(OUT_OF_RANGE)
    def check(values: dict[str, Any]) -> None:
        loop.run_until_complete(write_and_read(values))

    try:
        check()
    finally:
        loop.run_until_complete(engine.dispose())
        loop.close()
