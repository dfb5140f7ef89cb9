"""Activity over time: runs started, finished and failed per minute or per hour.

Stored instants are fixed-shape text (``2026-01-31T08:15:42.123Z``), so the
minute a run started in is its first 16 characters and the hour its first 13:
a store counts by ``substr`` of the column and never parses a date. A run counts
as started in the bucket of its ``started_at`` and as finished (done or failed)
in the bucket of its ``ended_at``; failed ones count among the finished too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobrun._core.model.formats import format_instant
from jobrun._core.model.ids import first_id_at
from jobrun._core.model.predicates import FAILED, has_ended_since
from jobrun._core.model.records import RunRow


@dataclass(frozen=True, slots=True)
class Resolution:
    """A chart's step: its name, the prefix length of a stored instant that names a
    bucket, one bucket's length, and how many buckets the chart shows."""

    name: str
    chars: int
    step: timedelta
    buckets: int


PER_MINUTE = Resolution("minute", 16, timedelta(minutes=1), 60)
"""The last hour, minute by minute."""
PER_HOUR = Resolution("hour", 13, timedelta(hours=1), 24)
"""The last day, hour by hour."""
RESOLUTIONS = {each.name: each for each in (PER_MINUTE, PER_HOUR)}


@dataclass(frozen=True, slots=True)
class ActivityQuery:
    """Which runs a chart counts, from ``since_at`` on (a bucket's first instant),
    bucketed by the first ``chars`` characters of their instants; ``None``: any."""

    since_at: str
    chars: int
    module_id: str | None = None
    job: str | None = None


@dataclass(frozen=True, slots=True)
class Counts:
    started: int = 0
    finished: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bar group of the chart: its first instant, and what happened in it."""

    starts_at: datetime
    counts: Counts


def _floor(moment: datetime, resolution: Resolution) -> datetime:
    if resolution.step >= timedelta(hours=1):
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def activity_query(
    now: datetime, resolution: Resolution, module_id: str | None = None, job: str | None = None
) -> ActivityQuery:
    """The query for the chart ending with the bucket ``now`` is in."""
    first = _floor(now, resolution) - resolution.step * (resolution.buckets - 1)
    return ActivityQuery(format_instant(first), resolution.chars, module_id, job)


def buckets_of(
    counted: Mapping[str, Counts], now: datetime, resolution: Resolution
) -> list[Bucket]:
    """Every bucket of the chart ending at ``now``, oldest first, empty ones included."""
    last = _floor(now, resolution)
    starts = [last - resolution.step * back for back in range(resolution.buckets - 1, -1, -1)]
    return [
        Bucket(start, counted.get(format_instant(start)[: resolution.chars], Counts()))
        for start in starts
    ]


def _matches_job(row: RunRow, query: ActivityQuery) -> bool:
    return (query.module_id is None or row.module_id == query.module_id) and (
        query.job is None or row.job == query.job
    )


def count_activity(rows: Iterable[RunRow], query: ActivityQuery) -> dict[str, Counts]:
    """What a store answers for ``query``: per bucket name (an instant's prefix), the
    runs started, finished and failed in it (the memory store's reading; the SQL
    store counts the same in the database)."""
    started: dict[str, int] = {}
    finished: dict[str, int] = {}
    failed: dict[str, int] = {}
    first_id = first_id_at(query.since_at)
    for row in rows:
        if not _matches_job(row, query):
            continue
        # As a console query's "started since" (jobrun._core.operator.browse.RunQuery): the id
        # bound is what lets a store read its primary key's range.
        if row.started_at >= query.since_at and row.id >= first_id:
            key = row.started_at[: query.chars]
            started[key] = started.get(key, 0) + 1
        if has_ended_since(row, query.since_at):
            key = (row.ended_at or "")[: query.chars]
            finished[key] = finished.get(key, 0) + 1
            failed[key] = failed.get(key, 0) + (row.status == FAILED)
    return {
        key: Counts(started.get(key, 0), finished.get(key, 0), failed.get(key, 0))
        for key in sorted(started.keys() | finished.keys())
    }
