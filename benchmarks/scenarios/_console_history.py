"""The console scenarios' history: many finished runs, filled in one statement.

One INSERT ... SELECT per database: runs of 20 jobs started 2.592 s apart, ids real
ULIDs of their start, 1% failed, the newest 50 running (10 of them stranded).
"""

from __future__ import annotations

import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun

STEP_MS = 2_592
"""Runs start 2.592 s apart: 1,000,000 runs span 30 days, as a busy history would."""
FIRST_MS = int(time.time()) * 1000 - 1_000_000 * STEP_MS
"""Whole seconds, so that the 1,000,000th run starts now: the activity chart and the
errors page read the history's last hour and day."""
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

_COLUMNS = (
    "id, module_id, job, instance, payload, status, cursor, counters, attempts, last_error, "
    "started_at, updated_at, next_attempt_at, ended_at, lease_owner, lease_driver, "
    "lease_began_at, lease_takeovers"
)


def _ulid_time(ms: str) -> str:
    """SQL for the 10 ULID characters of the millisecond ``ms`` (same on both engines)."""
    return " || ".join(
        f"substr('{CROCKFORD}', CAST((({ms}) >> {5 * place}) & 31 AS INTEGER) + 1, 1)"
        for place in range(9, -1, -1)
    )


def _fill_select(i: str, ms: str, started_at: str, pad: str) -> str:
    """One run per ``i``: 20 jobs, 1,000 tenants, 1% failed spread over the history,
    the newest 50 running (the last 10 of them stranded: leased, lease expired)."""
    return f"""
SELECT {_ulid_time(ms)} || {pad}, 'shop', 'job-' || ({i} % 20),
       'tenant-' || ({i} % 1000) || '/' || {i}, '{{}}',
       CASE WHEN {i} > :count - 50 THEN 'running' WHEN ({i} / 20) % 100 = 0 THEN 'failed'
            ELSE 'done' END,
       NULL, '{{}}', 0,
       CASE WHEN ({i} / 20) % 100 = 0 THEN 'KeyError: order ' || {i} || ' not found' END,
       {started_at}, {started_at},
       CASE WHEN {i} > :count - 10 THEN {started_at} END,
       CASE WHEN {i} <= :count - 50 THEN {started_at} END,
       CASE WHEN {i} > :count - 10 THEN 'token' END,
       CASE WHEN {i} > :count - 10 THEN 'gone-host' END,
       CASE WHEN {i} > :count - 10 THEN {started_at} END, 0"""


_SQLITE_MS = f"({FIRST_MS} + i * {STEP_MS})"
_SQLITE_STARTED_AT = f"strftime('%Y-%m-%dT%H:%M:%fZ', {_SQLITE_MS} / 1000, 'unixepoch')"
_SQLITE_FILL = f"""
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)
INSERT INTO _substrat_job_runs ({_COLUMNS})
{_fill_select("i", _SQLITE_MS, _SQLITE_STARTED_AT, "printf('%016d', i)")}
FROM n
"""
_POSTGRES_MS = f"({FIRST_MS}::bigint + i::bigint * {STEP_MS})"
_POSTGRES_STARTED_AT = (
    f"to_char(to_timestamp({_POSTGRES_MS} / 1000) AT TIME ZONE 'UTC', "
    """'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"""
)
_POSTGRES_FILL = f"""
INSERT INTO _substrat_job_runs ({_COLUMNS})
{_fill_select("i", _POSTGRES_MS, _POSTGRES_STARTED_AT, "lpad(i::text, 16, '0')")}
FROM generate_series(1, :count) AS i
"""


async def fill(engine: AsyncEngine, count: int, postgres: bool) -> float:
    began = time.perf_counter()
    await jobrun.upgrade(engine)
    async with engine.begin() as connection:
        await connection.execute(
            text(_POSTGRES_FILL if postgres else _SQLITE_FILL), {"count": count}
        )
    if postgres:
        # What autovacuum does soon after a bulk load: statistics, and the visibility map
        # that lets a count read the index alone.
        async with engine.connect() as connection:
            autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.execute(text("VACUUM ANALYZE _substrat_job_runs"))
    return time.perf_counter() - began


def ulid_time(ms: int) -> str:
    """The 10 ULID characters of the millisecond ``ms``."""
    return "".join(CROCKFORD[(ms >> (5 * place)) & 31] for place in range(9, -1, -1))
