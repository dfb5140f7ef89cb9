"""The runs facet of the SQL store: starts and the pass's own reads and writes
(``JobRunStore``; statements in :mod:`jobrun.sql.statements.runs`).

Single starts from concurrent callers go out together as one batch (see
:mod:`jobrun.sql.start_batches`); a batch of starts is a fixed number of statements
whatever its size (Postgres: with its NOTIFY per job); a new step one statement,
durable on return; a pass commit one transaction (one statement on Postgres).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from functools import partial
from operator import attrgetter
from typing import Any, cast

from sqlalchemy.exc import SQLAlchemyError

from jobrun._core import WRITTEN_PAUSED, RunPatch, RunRow, StepRow, paused_start
from jobrun.errors import StoreError
from jobrun.sql.caller_connection import caller_fetch, checked_caller_connection
from jobrun.sql.postgres.tenancy import notify_channel
from jobrun.sql.start_batches import StartBatches
from jobrun.sql.statements.runs import (
    PATCH_COLUMNS,
    RUN_COLUMNS,
    START_MANY_OWN,
    START_MANY_SHARED,
    RunStatements,
)
from jobrun.sql.store.base import Fetch, SqlStoreBase, fence_values, kept_changing, prefixed_values

_START_RETRIES = 10
_NOTIFY_MAX_BYTES = 7000  # Postgres refuses payloads of 8000 bytes and more


def notify_payload(row: RunRow) -> str:
    """``["module_id", "job"]`` as JSON (a module id may itself contain ``/``); empty when
    too long for a notification (listeners then wake for any job)."""
    return notify_payload_of(row.module_id, row.job)


def notify_payload_of(module_id: str, job: str) -> str:
    """:func:`notify_payload` of a job."""
    text = json.dumps([module_id, job])
    return text if len(text.encode("utf-8")) <= _NOTIFY_MAX_BYTES else ""


def _as_started(row: RunRow, answer: Sequence[Any]) -> RunRow:
    """The row a start inserted, paused as its statement answered (its last two
    columns: a run of a paused job starts paused)."""
    paused_at, reason = answer[-2], answer[-1]
    return row if paused_at is None else paused_start(row, paused_at, reason)


def _key_of(row: RunRow) -> tuple[str, str, str]:
    return (row.module_id, row.job, row.instance)


_OWN_VALUES = attrgetter(*START_MANY_OWN)
_SHARED_VALUES = attrgetter(*START_MANY_SHARED)


def start_many_values(rows: Sequence[RunRow], schema: str | None) -> dict[str, Any]:
    """``start_many``'s values: each row's own columns in one JSON array of arrays
    (``rows``), the columns the batch shares bound once (``shared_*``)."""
    shared = _SHARED_VALUES(rows[0])
    # The store's own rule, kept by its callers: start_job_runs makes fresh rows, and
    # single starts' batches are grouped by these values (SqlRuns._start_batch).
    assert all(_SHARED_VALUES(row) == shared for row in rows), "rows differ in shared columns"
    values = dict(zip([f"shared_{name}" for name in START_MANY_SHARED], shared, strict=True))
    values["rows"] = json.dumps(builtins.list(map(_OWN_VALUES, rows)), ensure_ascii=False)
    values["notify_channel"] = notify_channel(schema)
    return values


def start_values(row: RunRow, schema: str | None) -> dict[str, Any]:
    """The values of the start statements for ``row`` (its NOTIFY's included)."""
    return prefixed_values("row_", row, RUN_COLUMNS) | {
        "notify_channel": notify_channel(schema),
        "notify_payload": notify_payload(row),
    }


async def start_in(
    fetch: Fetch,
    statements: RunStatements,
    row: RunRow,
    values: Mapping[str, Any],
    insert: Any = None,
) -> tuple[RunRow, bool] | None:
    """Insert ``row`` (with ``insert``, by default the one that notifies on Postgres),
    or read the live run of its key; ``None`` when the live run kept ending between
    the two. A start, and a schedule's slot starting its run in its transaction."""
    for _ in range(_START_RETRIES):
        inserted = await fetch(insert or statements.start, values)
        if inserted:
            return _as_started(row, inserted[0]), True
        found = await fetch(statements.live, values)
        if found:
            return RunRow(*found[0]), False
        # The live run ended between our insert and our read: try again.
    return None


class SqlRuns(SqlStoreBase):
    """Starts, a run by id, and the pass's writes: the failed pass's patch, the
    commit that drops the ledger with it, the ledger's read and its step writes."""

    _start_batches: StartBatches

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        # With the starts of concurrent callers, in one statement (start_batches.py).
        return await self._start_batches.start(row)

    async def _start_batch(self, rows: Sequence[RunRow]) -> builtins.list[tuple[RunRow, bool]]:
        """The single starts' batch: ``start_many``'s statements, in groups of rows that
        share their constant columns (concurrent callers' rows differ only in the
        columns each row carries, so always one group unless rows were made elsewhere)."""
        groups: dict[tuple[Any, ...], builtins.list[RunRow]] = {}
        for row in rows:
            groups.setdefault(_SHARED_VALUES(row), []).append(row)
        fetch = partial(self._executor.fetch, "start_or_join")
        found: dict[str, tuple[RunRow, bool]] = {}
        async with self._operation("start_or_join"):
            for group in groups.values():
                # The partial unique index decides: at most one live row per key,
                # whatever number of hosts race here.
                started = await self._start_many_in(fetch, group)
                if started is None:
                    raise kept_changing("start_or_join")
                found.update(zip([row.id for row in group], started, strict=True))
        return [found[row.id] for row in rows]

    async def start_many(
        self, rows: Sequence[RunRow], *, connection: object | None = None
    ) -> builtins.list[tuple[RunRow, bool]]:
        if not rows:
            return []
        async with self._operation("start_many"):
            if connection is None:
                found = await self._start_many_in(partial(self._executor.fetch, "start_many"), rows)
            else:
                fetch = caller_fetch(checked_caller_connection(connection, self._engine))
                try:
                    found = await self._start_many_in(fetch, rows)
                except SQLAlchemyError as error:
                    raise StoreError("start_many", error) from error
        if found is None:
            raise kept_changing("start_many")
        return found

    async def _start_many_in(
        self, fetch: Fetch, rows: Sequence[RunRow]
    ) -> builtins.list[tuple[RunRow, bool]] | None:
        """Insert the rows whose key is not live (one statement), then read the live
        run of each other key (one more, only if any); ``None`` when a key's live run
        kept ending between the two."""
        found: dict[tuple[str, str, str], tuple[RunRow, bool]] = {}
        # In key order, so that two batches sharing keys lock them in one order
        # (Postgres: no deadlock between their inserts).
        todo = sorted(rows, key=_key_of)
        for _ in range(_START_RETRIES):
            values = start_many_values(todo, self._schema)
            answers = await fetch(self._statements.start_many, values)
            inserted = {answer[0]: answer for answer in answers}
            rest = [row for row in todo if row.id not in inserted]
            found.update(
                (_key_of(row), (_as_started(row, inserted[row.id]), True))
                for row in todo
                if row.id in inserted
            )
            if rest:
                keys = json.dumps([_key_of(row) for row in rest])
                for answer in await fetch(self._statements.live_many, {"keys": keys}):
                    live = RunRow(*answer)
                    found[_key_of(live)] = (live, False)
            todo = [row for row in rest if _key_of(row) not in found]
            if not todo:
                return [found[_key_of(row)] for row in rows]
            # A live run ended between the insert and the read: try its key again.
        return None

    async def get(self, run_id: str) -> RunRow | None:
        async with self._operation("get"):
            found = await self._executor.fetch("get", self._statements.get, {"run_id": run_id})
        return RunRow(*found[0]) if found else None

    def _patch_values(self, run_id: str, patch: RunPatch, token: str) -> dict[str, Any]:
        values = fence_values(run_id, token) | prefixed_values("new_", patch, PATCH_COLUMNS)
        if self._is_postgres:
            # A new token, still leased: the lease handed to the next pass, whose
            # expiry Postgres counts on its own clock (see statements.runs._handed_on_expiry).
            successor = patch.lease_owner if patch.lease_owner != token else None
            handed_on = successor is not None and self._database_clock_leases.hand_on(
                token, successor
            )
            values["handed_on"] = int(handed_on)
            # Postgres judges leases on its own clock: no boot clock is stored there.
            values |= {"new_lease_boot_id": None, "new_lease_boot_expires_ms": None}
            if patch.lease_owner != token:
                # This token's lease ends with this write (or is already gone).
                self._database_clock_leases.forget(token)
        return values

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = self._patch_values(run_id, patch, token)
        return await self._lone_write("patch", self._statements.patch, values)

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> int:
        values = self._patch_values(run_id, patch, token)
        statements = self._statements
        if self._is_postgres:
            async with self._operation("commit_pass"):
                written = await self._executor.fetch(
                    "commit_pass", statements.commit_in_one, values
                )
        else:
            # SQLite has no data-modifying CTEs: two statements, one transaction.
            async with (
                self._operation("commit_pass"),
                self._executor.transaction("commit_pass") as tx,
            ):
                written = await tx.fetch(statements.patch, values)
                if written:
                    await tx.fetch(statements.drop_ledger, values)
        # The write returns the run's pause: a paused run's next pass is not run.
        if not written:
            return False
        return WRITTEN_PAUSED if written[0][1] is not None else True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        async with self._operation("steps"):
            rows = await self._executor.fetch("steps", self._statements.steps, {"run_id": run_id})
        return {row[0]: StepRow(*row) for row in rows}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> int:
        # The one write that makes a step durable: one statement, committed on return.
        # The step's path, so written flat: its values straight into a list in the
        # statement's order (RECORD_STEP_ORDER), and _lone_write's steps inline.
        arguments = [row.step, row.result, row.attempts, row.last_error, recorded_at, run_id, token]
        if not self._schema_checked:
            async with self._operation("record_step"):
                pass
        try:
            if self._is_postgres:
                rows = await self._executor.fetch_in_order(
                    "record_step", self._statements.record_step, arguments
                )
            else:
                # The run is read twice (see RECORD_STEP_ORDER_SQLITE).
                count = cast(
                    int,
                    await self._executor.write_in_order(
                        "record_step", self._statements.record_step, arguments + arguments
                    ),
                )
        except self._executor.errors as error:
            raise StoreError("record_step", error) from error
        # Nothing written (no row changed, none returned): the fence refused. Written,
        # it says whether the run is paused: its pause returned (Postgres), or the
        # row written twice (SQLite).
        if self._is_postgres:
            return (WRITTEN_PAUSED if rows[0][0] is not None else True) if rows else False
        return WRITTEN_PAUSED if count > 1 else bool(count)
