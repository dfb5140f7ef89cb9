"""The browse facet of the SQL store: the operator's listing and the console's reads
(``JobRunStore.list`` and :class:`jobrun._core.operator.browse.BrowsableStore`; statements in
:mod:`jobrun.sql.statements.browse`).

A page reads newest first down an index ending in id, stopped by the limit: it
costs the same on the first and the thousandth page, however many runs are kept.
"""

from __future__ import annotations

import builtins
from typing import Any

from jobrun._core import (
    ActivityQuery,
    Counts,
    JobLoad,
    JobRunStatus,
    PresenceSeen,
    RunFilter,
    RunQuery,
    RunRow,
    first_id_at,
    presence_seen,
)
from jobrun.sql.postgres.presence import live_presences_statement
from jobrun.sql.statements.browse import (
    LIST_FILTERS,
    activity_ended_statement,
    activity_started_statement,
    collation_statement,
    count_statement,
    find_statement,
    is_bytewise_collation,
    job_loads_statement,
    list_statement,
)
from jobrun.sql.statements.rules import RUNNING
from jobrun.sql.store.base import SqlStoreBase, numbered


def _status_arms(query: RunQuery) -> tuple[str, ...]:
    """The statuses a page reads one by one: those asked for, or all of them within
    one job (so each reads (module_id, job, status, id) in id order)."""
    if query.stranded_at is not None:
        return (RUNNING,)
    if query.statuses:
        return tuple(sorted(set(query.statuses)))
    if query.module_id is not None and query.job is not None:
        return tuple(member.value for member in JobRunStatus)
    return ()


def _prefix_successor(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (code point order,
    which is UTF-8 byte order); ``None`` when there is none."""
    for position in range(len(prefix) - 1, -1, -1):
        point = ord(prefix[position]) + 1
        if 0xD800 <= point <= 0xDFFF:
            point = 0xE000  # surrogates are not characters
        if point <= 0x10FFFF:
            return prefix[:position] + chr(point)
    return None


class SqlBrowse(SqlStoreBase):
    """The listing, a page of runs, a capped count, each job's load, the activity
    chart and the presences Postgres holds."""

    # Whether the database compares text bytewise (SQLite always; Postgres when its
    # collation is C or C.UTF-8), learned at the first instance prefix filter.
    _bytewise_text: bool | None

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        given = tuple(name for name in LIST_FILTERS if getattr(run_filter, name) is not None)
        statement = self._shapes.of(list_statement, given, run_filter.cancelled, run_filter.paused)
        values: dict[str, Any] = {f"filter_{name}": getattr(run_filter, name) for name in given}
        values["limit"] = run_filter.limit
        async with self._operation("list"):
            rows = await self._executor.fetch("list", statement, values)
        return [RunRow(*row) for row in rows]

    def _selection(self, query: RunQuery) -> dict[str, Any]:
        """The values of ``query``'s conditions, named as ``statements.browse.find_statement``
        reads them; their names are the statement's shape."""
        values: dict[str, Any] = {}
        if query.module_id is not None:
            values["query_module_id"] = query.module_id
        if query.job is not None:
            values["query_job"] = query.job
        prefix = query.instance_prefix
        if prefix:
            values |= {"query_prefix_length": len(prefix), "query_prefix": prefix}
            if self._bytewise_text:
                # Bytewise comparison: the range is a superset of the prefix, and lets
                # the key index (within a job) or the instance index (without) seek.
                values["query_prefix_lower"] = prefix
                upper = _prefix_successor(prefix)
                if upper is not None:
                    values["query_prefix_upper"] = upper
        values |= {f"query_status_{status}": True for status in sorted(set(query.statuses))}
        if query.started_since_at is not None:
            values["query_started_since_at"] = query.started_since_at
            values["query_first_id"] = first_id_at(query.started_since_at)
        if query.stranded_at is not None:
            values["query_stranded_at"] = query.stranded_at
        if query.before_id is not None:
            values["query_before_id"] = query.before_id
        if query.leased_at is not None:
            values["query_leased_at"] = query.leased_at
        if query.failed_since_at is not None:
            values["query_failed_since_at"] = query.failed_since_at
        if query.cancelled is not None:
            values["query_cancelled" if query.cancelled else "query_not_cancelled"] = True
        if query.paused is not None:
            values["query_paused" if query.paused else "query_not_paused"] = True
        return values

    async def _learn_collation(self, query: RunQuery) -> None:
        if self._bytewise_text is not None or not query.instance_prefix:
            return
        async with self._operation("collation"):
            found = await self._executor.fetch(
                "collation", self._shapes.of(collation_statement), {}
            )
        self._bytewise_text = is_bytewise_collation(str(found[0][0]))

    async def find(self, query: RunQuery) -> builtins.list[RunRow]:
        await self._learn_collation(query)
        # Newest first down an index ending in id, stopped by the limit: a page costs
        # the same on the first and the thousandth page, however many runs are kept.
        values = self._selection(query)
        arms = _status_arms(query)
        arms = arms if len(arms) > 1 else ()
        statement = self._shapes.of(find_statement, tuple(values), len(arms))
        values |= numbered("arm", arms) | {"limit": query.limit}
        async with self._operation("find"):
            rows = await self._executor.fetch("find", statement, values)
        return [RunRow(*row) for row in rows]

    async def count(self, query: RunQuery, cap: int) -> int:
        await self._learn_collation(query)
        values = self._selection(query)
        statement = self._shapes.of(count_statement, tuple(values))
        async with self._operation("count"):
            found = await self._executor.fetch("count", statement, values | {"cap": cap})
        return int(found[0][0])

    async def job_loads(self, now_at: str, failed_since_at: str) -> builtins.list[JobLoad]:
        statement = self._shapes.of(job_loads_statement)
        values = {"now_at": now_at, "failed_since_at": failed_since_at}
        async with self._operation("job_loads"):
            rows = await self._executor.fetch("job_loads", statement, values)
        return [
            JobLoad(row[0], row[1], int(row[2]), int(row[3]), row[4], int(row[5]), int(row[6]))
            for row in rows
        ]

    async def activity(self, query: ActivityQuery) -> dict[str, Counts]:
        values: dict[str, Any] = {"activity_since_at": query.since_at}
        if query.module_id is not None:
            values["activity_module_id"] = query.module_id
        if query.job is not None:
            values["activity_job"] = query.job
        names = tuple(values)
        started = self._shapes.of(activity_started_statement, query.chars, names)
        ended = self._shapes.of(activity_ended_statement, query.chars, names)
        async with self._operation("activity"):
            started_rows = await self._executor.fetch(
                "activity", started, values | {"activity_first_id": first_id_at(query.since_at)}
            )
            ended_rows = await self._executor.fetch("activity", ended, values)
        counted = {bucket: [int(count), 0, 0] for bucket, count in started_rows}
        for bucket, finished, failed in ended_rows:
            counted.setdefault(bucket, [0, 0, 0])[1:] = [int(finished), int(failed)]
        return {bucket: Counts(*counted[bucket]) for bucket in sorted(counted)}

    async def live_presences(self) -> builtins.list[PresenceSeen]:
        if not self._is_postgres:
            return []
        statement = self._shapes.of(live_presences_statement)
        async with self._operation("live_presences"):
            rows = await self._executor.fetch("live_presences", statement, {})
        return [presence_seen(int(row[0]), row[1], row[2], row[3]) for row in rows]
