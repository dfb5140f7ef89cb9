"""``SqlJobRunStore``: the store port on SQLAlchemy Core, for SQLite and Postgres.

Every operation picks statements from :mod:`jobrun.sql.statements`, binds their
values and sends them through the store's one executor (:mod:`jobrun.sql.executor`);
round trips per operation are listed in ``docs/design.md`` ("Round trips").
Methods are grouped as the port's protocols are (:mod:`jobrun._core.port`): the
pass engine's and driver's ``JobRunStore``, the ``OperatorStore``, the
``ScheduleStore``, then the console's reads (:mod:`jobrun._core.operator.browse`).
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from operator import attrgetter
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_STEP_RESULT_BYTES,
    ActivityQuery,
    Claimed,
    ClaimRequest,
    ClaimTurns,
    Counts,
    HealthCounts,
    HeldLease,
    JobLoad,
    JobRunStatus,
    LimitUsage,
    OrphanScans,
    OwedReleases,
    PresenceSeen,
    RunChange,
    RunFilter,
    RunPatch,
    RunQuery,
    RunRow,
    ScheduleRow,
    StepRow,
    StoreLimits,
    WorkerRow,
    deprecated_scans,
    first_id_at,
    not_watching,
    parse_instant,
    presence_seen,
    refuse_type,
    type_name,
)
from jobrun._system import system_clock
from jobrun.errors import JobConflictError, StoreError
from jobrun.sql.caller_connection import caller_fetch, checked_caller_connection
from jobrun.sql.claims import Fetch, SqlClaims, limit_lock_key, numbered, pairs
from jobrun.sql.database_clock import DatabaseClockLeases
from jobrun.sql.executor import Compiler, StatementHook, executor_for
from jobrun.sql.limit_store import SqlLimits
from jobrun.sql.presence import Presence, PresenceNotHeld, live_presences_statement
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.sqlite_setup import configure_sqlite
from jobrun.sql.start_wakeups import StartWakeUps
from jobrun.sql.statements import (
    LIST_FILTERS,
    PATCH_COLUMNS,
    RUN_COLUMNS,
    RUNNING,
    SCHEDULE_COLUMNS,
    Shapes,
    Statements,
    activity_ended_statement,
    activity_started_statement,
    add_schedule_statement,
    beat_worker_statement,
    change_statement,
    clock_statement,
    collation_statement,
    count_statement,
    find_statement,
    forget_retention_statement,
    forget_worker_statement,
    held_leases_statement,
    is_bytewise_collation,
    job_loads_statement,
    list_statement,
    live_workers_statement,
    point_slot_statement,
    prune_ledgers,
    prune_runs,
    record_retention_statement,
    recorded_retention_statement,
    remove_schedule_statement,
    reset_schedule_statement,
    schedule_rows_statement,
    sweep_workers_statement,
    take_slot_statement,
)
from jobrun.sql.tenancy import checked_schema, in_schema, notify_channel

__all__ = ["SqlJobRunStore", "limit_lock_key", "notify_payload"]

WORKER_FIELDS = tuple(WorkerRow.__dataclass_fields__)

_START_RETRIES = 10
_NOTIFY_MAX_BYTES = 7000  # Postgres refuses payloads of 8000 bytes and more
# How often the skew between this host's clock and Postgres's is measured again.
CLOCK_CHECK_INTERVAL_S = 60.0


def notify_payload(row: RunRow) -> str:
    """``["module_id", "job"]`` as JSON (a module id may itself contain ``/``); empty when
    too long for a notification (listeners then wake for any job)."""
    text = json.dumps([row.module_id, row.job])
    return text if len(text.encode("utf-8")) <= _NOTIFY_MAX_BYTES else ""


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


def _values(prefix: str, record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    # getattr, not dataclasses.astuple: that deep-copies every field (a pass commit pays it).
    return {f"{prefix}{name}": getattr(record, name) for name in names}


def _slot_values(schedule: ScheduleRow) -> dict[str, Any]:
    """The key of ``schedule``'s row, named as ``statements._slot_key`` reads it."""
    return {
        "slot_module_id": schedule.module_id,
        "slot_job": schedule.job,
        "slot_schedule": schedule.schedule,
    }


_RUN_VALUES = attrgetter(*RUN_COLUMNS)


def _key_of(row: RunRow) -> tuple[str, str, str]:
    return (row.module_id, row.job, row.instance)


def _rows_json(rows: Sequence[RunRow]) -> str:
    """Rows as one JSON array of arrays (``RUN_COLUMNS`` order): ``start_many``'s ``rows``."""
    return json.dumps(builtins.list(map(_RUN_VALUES, rows)), ensure_ascii=False)


def _kept_changing(operation: str) -> StoreError:
    return StoreError(operation, RuntimeError("the key's live run kept changing; gave up"))


def _fence_values(run_id: str, token: str) -> dict[str, Any]:
    return {"fence_id": run_id, "fence_token": token}


# Compiled statements by dialect and schema: a worker over a thousand databases makes
# a thousand stores, and compiling the fixed statements takes tens of ms per store.
_COMPILED: dict[tuple[Any, ...], tuple[Statements, Shapes]] = {}


def _compiled_for(engine: AsyncEngine, schema: str | None) -> tuple[Statements, Shapes]:
    dialect = engine.dialect
    key = (
        type(dialect),
        dialect.paramstyle,
        getattr(dialect, "server_version_info", None),
        schema,
    )
    found = _COMPILED.get(key)
    if found is None:
        compile_ = Compiler(dialect, None if schema is None else {None: schema})
        is_postgres = dialect.name == "postgresql"
        found = _COMPILED[key] = (Statements(compile_, is_postgres), Shapes(compile_))
    return found


class SqlJobRunStore:
    """Runs and step ledgers in a SQLite or Postgres database reached through ``engine``.

    Works with a plain engine and honours its configuration (pool, connect and
    checkout events): on SQLite it turns on WAL and a busy timeout for the
    connections it uses. The schema must have been created with
    :func:`jobrun.upgrade`; the first operation checks that, once.

    Statements go straight to the driver (aiosqlite, asyncpg), so SQLAlchemy's
    statement events do not see them: ``statement_hook`` is called as
    ``async with statement_hook(operation, sql, parameters):`` around every statement it
    sends, for counting, tracing or fault injection (see
    :data:`jobrun.StatementHook`).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_cursor_bytes: int | None = None,
        max_step_result_bytes: int = DEFAULT_MAX_STEP_RESULT_BYTES,
        max_counters_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        sqlite_busy_timeout_ms: int = 30_000,
        schema: str | None = None,
        statement_hook: StatementHook | None = None,
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise refuse_type(
                "engine",
                f"must be an AsyncEngine, got {type_name(engine)}",
                message="SqlJobRunStore needs an AsyncEngine (from create_async_engine), "
                f"got {type_name(engine)}",
            )
        self._host_engine = engine
        self._schema = checked_schema(engine, schema)
        # The schema check runs through SQLAlchemy: a copy of the engine whose
        # translate map puts jobrun's tables in the schema (the host's stays as it is).
        self._engine = in_schema(engine, self._schema)
        self._limits = StoreLimits(
            max_payload_bytes=max_payload_bytes,
            max_cursor_bytes=max_payload_bytes if max_cursor_bytes is None else max_cursor_bytes,
            max_step_result_bytes=max_step_result_bytes,
            max_counters_bytes=max_counters_bytes,
        )
        self._executor = executor_for(engine, statement_hook)
        self._is_postgres = engine.dialect.name == "postgresql"
        # Whether the database compares text bytewise (SQLite always; Postgres when its
        # collation is C or C.UTF-8), learned at the first instance prefix filter.
        self._bytewise_text: bool | None = None if self._is_postgres else True
        if not self._is_postgres:
            configure_sqlite(engine, sqlite_busy_timeout_ms)
        # In a schema, every compiled statement names it (rendered once, here).
        self._statements, self._shapes = _compiled_for(engine, self._schema)
        self._claims = SqlClaims(self._executor, self._shapes, self._is_postgres, self._schema)
        self._limit_operations = SqlLimits(
            self._executor, self._shapes, self._is_postgres, self._schema
        )
        self._schema_checked = False
        # Kept by the store because it is what every drive of this database shares.
        self._owed_releases = OwedReleases()
        self._start_wakeups = StartWakeUps()
        self._claim_turns = ClaimTurns()
        self._orphan_scans = OrphanScans()
        # Postgres: the host's own engine, whose dispose is what lets go of the presence.
        self._presence = Presence(self._host_engine) if self._is_postgres else None
        # Tokens of the leases this store claimed on the database's clock.
        self._database_clock_leases = DatabaseClockLeases()
        # (measured at, database clock minus system clock in seconds)
        self._clock_offset: tuple[float, float] | None = None

    @property
    def engine(self) -> AsyncEngine:
        """The engine this store was made with (the host owns and disposes of it)."""
        return self._host_engine

    @property
    def schema(self) -> str | None:
        """The Postgres schema holding jobrun's tables, or ``None`` for the default."""
        return self._schema

    # -- what every operation goes through --------------------------------------------------

    @property
    def orphan_scans(self) -> OrphanScans:
        return self._orphan_scans

    @property
    def stranded_scans(self) -> OrphanScans:
        """Deprecated alias of :attr:`orphan_scans` (removed in the next release)."""
        return deprecated_scans(self)

    @asynccontextmanager
    async def _operation(self, name: str) -> AsyncIterator[None]:
        """Translate driver and database errors into StoreError, once, here."""
        try:
            if not self._schema_checked:
                await self._check_schema()
            yield
        except self._executor.errors as error:
            raise StoreError(name, error) from error
        except PresenceNotHeld as error:
            raise StoreError(name, error) from error

    async def _check_schema(self) -> None:
        # One read per store lifetime, so that a database nobody upgraded fails
        # with the command to run rather than "no such table".
        # And, on a database newer than this code, whether its revisions let this
        # code run against it (jobrun.sql.compat): never claim under rules it lacks.
        from jobrun.sql.compat import checked_against

        async with self._engine.connect() as connection:
            refused = await connection.run_sync(checked_against, self._schema, SCHEMA_REVISION)
        if refused is not None:
            raise refused
        self._schema_checked = True

    async def _lone_write(self, operation: str, statement: Any, values: Mapping[str, Any]) -> bool:
        """Send one write on its own (no transaction) and say whether it applied (it
        returns a row when it did): the step write's path, so the error translation of
        ``_operation`` is spelled out, without a context manager."""
        if not self._schema_checked:
            async with self._operation(operation):
                pass
        try:
            return bool(await self._executor.fetch(operation, statement, values))
        except self._executor.errors as error:
            raise StoreError(operation, error) from error

    # -- JobRunStore: runs, the claim, leases, the pass's writes ------------------------------

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._host_engine

    @property
    def owed_releases(self) -> OwedReleases:
        return self._owed_releases

    @property
    def claim_turns(self) -> ClaimTurns:
        return self._claim_turns

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        values = self._start_values(row)
        fetch = partial(self._executor.fetch, "start_or_join")
        async with self._operation("start_or_join"):
            # The partial unique index decides: at most one live row per key,
            # whatever number of hosts race here.
            if self._is_postgres:
                started = await self._start_waking(fetch, row, values)
            else:
                started = await self._start_in(fetch, row, values)
        if started is None:
            raise _kept_changing("start_or_join")
        return started

    async def _start_waking(
        self, fetch: Fetch, row: RunRow, values: Mapping[str, Any]
    ) -> tuple[RunRow, bool] | None:
        """Postgres: :meth:`_start_in`, waking listening workers with at most one NOTIFY
        in flight per store (``jobrun.sql.start_wakeups``): the NOTIFY rides in the
        insert when none is, else the wake-up goes out after the commit, shared."""
        wakeups = self._start_wakeups

        async def send(payloads: builtins.list[str]) -> object:
            channel = notify_channel(self._schema)
            notify = {"notify_channel": channel, "payloads": json.dumps(payloads)}
            return await fetch(self._statements.notify_many, notify)

        if wakeups.take():
            try:
                return await self._start_in(fetch, row, values)
            finally:
                await wakeups.release(send)
        started = await self._start_in(fetch, row, values, self._statements.start_quiet)
        if started is not None and started[1]:
            await wakeups.after_commit(values["notify_payload"], send)
        return started

    async def _start_in(
        self, fetch: Fetch, row: RunRow, values: Mapping[str, Any], insert: Any = None
    ) -> tuple[RunRow, bool] | None:
        """Insert ``row`` (with ``insert``, by default the one that notifies on Postgres),
        or read the live run of its key; ``None`` when the live run kept ending between
        the two."""
        statements = self._statements
        for _ in range(_START_RETRIES):
            if await fetch(insert or statements.start, values):
                return row, True
            found = await fetch(statements.live, values)
            if found:
                return RunRow(*found[0]), False
            # The live run ended between our insert and our read: try again.
        return None

    def _start_values(self, row: RunRow) -> dict[str, Any]:
        return _values("row_", row, RUN_COLUMNS) | {
            "notify_channel": notify_channel(self._schema),
            "notify_payload": notify_payload(row),
        }

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
            raise _kept_changing("start_many")
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
            values = {"rows": _rows_json(todo), "notify_channel": notify_channel(self._schema)}
            inserted = {answer[0] for answer in await fetch(self._statements.start_many, values)}
            rest = [row for row in todo if row.id not in inserted]
            found.update((_key_of(row), (row, True)) for row in todo if row.id in inserted)
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

    async def claim(self, request: ClaimRequest) -> Claimed | None:
        claimed = await self.claim_batch(request, [request.token])
        return claimed[0] if claimed else None

    async def claim_batch(
        self, request: ClaimRequest, tokens: Sequence[str]
    ) -> builtins.list[Claimed]:
        if not request.expires_at or not tokens:
            return []
        # Postgres judges expiries on its own clock, at the statement.
        database_clock = self._is_postgres and request.database_clock
        async with self._operation("claim"):
            claimed = await self._claims.claim(request, tokens, database_clock)
        if database_clock:
            for taken in claimed:
                self._database_clock_leases.remember(taken.row.lease_owner or "")
        return claimed

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> builtins.list[HeldLease]:
        values: dict[str, Any] = {"now_at": now_at}
        if jobs is not None:
            if not jobs:
                return []
            values |= pairs("", sorted(jobs))
        count = None if jobs is None else len(jobs)
        statement = self._shapes.of(held_leases_statement, count, self._presence is not None)
        async with self._operation("held_leases"):
            rows = await self._executor.fetch("held_leases", statement, values)
        return [HeldLease(*row) for row in rows]

    async def presence(self) -> int | None:
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.key()

    def watch_presence(self, key: int | None, lost: Callable[[], None]) -> Callable[[], None]:
        if self._presence is None:
            return not_watching
        return self._presence.watch(key, lost)

    def presence_fd(self, key: int | None) -> int | None:
        return None if self._presence is None else self._presence.socket_fd(key)

    async def presence_connection(self) -> Any:
        """Postgres (asyncpg): the presence's own connection, which ``jobrun.worker``
        also LISTENs on; ``None`` elsewhere."""
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.connection()

    async def on_presence_connection(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        """Postgres: ``operation(raw)`` on the presence connection, one at a time
        with its liveness checks (``LISTEN`` goes through here)."""
        assert self._presence is not None, "only Postgres has a presence connection"
        async with self._operation("presence"):
            return await self._presence.on_connection(operation)

    async def held_leases_on_presence(
        self, now_at: str, jobs: frozenset[tuple[str, str]]
    ) -> builtins.list[HeldLease]:
        """Postgres: :meth:`held_leases` of ``jobs`` read on the presence connection,
        as an idle worker looks for dead holders (``jobrun.worker``): one round trip,
        no pool connection taken for it."""
        if not jobs:
            return []
        statement = self._shapes.of(held_leases_statement, len(jobs), True)
        arguments = statement.arguments({"now_at": now_at} | pairs("", sorted(jobs)))

        async def read(raw: Any) -> Any:
            return await raw.fetch(statement.sql, *arguments)

        return [HeldLease(*row) for row in await self.on_presence_connection(read)]

    async def clock_offset_s(self) -> float:
        if not self._is_postgres:
            return 0.0
        cached = self._clock_offset
        if cached is not None and time.monotonic() - cached[0] < CLOCK_CHECK_INTERVAL_S:
            return cached[1]
        statement = self._shapes.of(clock_statement)
        async with self._operation("clock_offset"):
            sent = system_clock().timestamp()
            found = await self._executor.fetch("clock_offset", statement, {})
            received = system_clock().timestamp()
        # The database read its clock about halfway through the round trip.
        offset = float(found[0][0].timestamp()) - (sent + received) / 2
        self._clock_offset = (time.monotonic(), offset)
        return offset

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        given = tuple(name for name in LIST_FILTERS if getattr(run_filter, name) is not None)
        statement = self._shapes.of(list_statement, given, run_filter.cancelled)
        values: dict[str, Any] = {f"filter_{name}": getattr(run_filter, name) for name in given}
        values["limit"] = run_filter.limit
        async with self._operation("list"):
            rows = await self._executor.fetch("list", statement, values)
        return [RunRow(*row) for row in rows]

    def _patch_values(self, run_id: str, patch: RunPatch, token: str) -> dict[str, Any]:
        values = _fence_values(run_id, token) | _values("new_", patch, PATCH_COLUMNS)
        if self._is_postgres:
            # A new token, still leased: the lease handed to the next pass, whose
            # expiry Postgres counts on its own clock (see statements._handed_on_expiry).
            successor = patch.lease_owner if patch.lease_owner != token else None
            handed_on = successor is not None and self._database_clock_leases.hand_on(
                token, successor
            )
            values["handed_on"] = int(handed_on)
            if patch.lease_owner != token:
                # This token's lease ends with this write (or is already gone).
                self._database_clock_leases.forget(token)
        return values

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = self._patch_values(run_id, patch, token)
        return await self._lone_write("patch", self._statements.patch, values)

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = self._patch_values(run_id, patch, token)
        statements = self._statements
        if self._is_postgres:
            return await self._lone_write("commit_pass", statements.commit_in_one, values)
        # SQLite has no data-modifying CTEs: two statements, one transaction.
        async with self._operation("commit_pass"), self._executor.transaction("commit_pass") as tx:
            if not await tx.fetch(statements.patch, values):
                return False
            await tx.fetch(statements.drop_ledger, values)
            return True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        async with self._operation("steps"):
            rows = await self._executor.fetch("steps", self._statements.steps, {"run_id": run_id})
        return {row[0]: StepRow(*row) for row in rows}

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        # The one write that makes a step durable: one statement, committed on return.
        # The step's path, so written flat: its values straight into a list in the
        # statement's order (RECORD_STEP_ORDER), and _lone_write's steps inline.
        arguments = [row.step, row.result, row.attempts, row.last_error, recorded_at, run_id, token]
        if not self._schema_checked:
            async with self._operation("record_step"):
                pass
        try:
            written = await self._executor.write_in_order(
                "record_step", self._statements.record_step, arguments
            )
        except self._executor.errors as error:
            raise StoreError("record_step", error) from error
        # Nothing written (no row changed, none returned): the fence refused.
        return bool(written)

    async def extend_lease(self, run_id: str, token: str, expires_at: str, now_at: str) -> bool:
        values = _fence_values(run_id, token) | {"expires_at": expires_at, "now_at": now_at}
        if token in self._database_clock_leases:
            # Only the lease's length: Postgres judges and counts it on its own clock.
            lease = parse_instant(expires_at) - parse_instant(now_at)
            values = _fence_values(run_id, token) | {"lease_ms": lease // timedelta(milliseconds=1)}
            statement = self._statements.extend_lease_on_database_clock
            return await self._lone_write("extend_lease", statement, values)
        return await self._lone_write("extend_lease", self._statements.extend_lease, values)

    # -- limits: rate-limit buckets and concurrency slots (jobrun.sql.limit_store) -------------

    async def take_token(self, key: str, per_second: float, burst: int) -> float:
        async with self._operation("take_token"):
            return await self._limit_operations.take_token(key, per_second, burst)

    async def give_back_token(self, key: str, burst: int) -> None:
        async with self._operation("give_back_token"):
            await self._limit_operations.give_back_token(key, burst)

    async def acquire_slot(
        self, key: str, most: int, run_id: str, step: str, token: str, now_at: str
    ) -> bool:
        async with self._operation("acquire_slot"):
            return await self._limit_operations.acquire_slot(key, most, run_id, step, token, now_at)

    async def release_slot(self, key: str, run_id: str, step: str, token: str, now_at: str) -> None:
        async with self._operation("release_slot"):
            await self._limit_operations.release_slot(key, run_id, step, token, now_at)

    async def cool_limit(
        self, key: str, per_second: float, burst: int, seconds: float, reason: str
    ) -> None:
        async with self._operation("cool_limit"):
            await self._limit_operations.cool_limit(key, per_second, burst, seconds, reason)

    async def limit_usage(self, now_at: str) -> LimitUsage:
        async with self._operation("limit_usage"):
            return await self._limit_operations.limit_usage(now_at)

    # -- OperatorStore: what operators do by hand ---------------------------------------------

    async def health(self, now_at: str) -> HealthCounts:
        async with self._operation("health"):
            found = await self._executor.fetch(
                "health", self._statements.health, {"now_at": now_at}
            )
        row = found[0]
        return HealthCounts(
            int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4], cancelled=int(row[5])
        )

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        async with self._operation("due_by_job"):
            found = await self._executor.fetch(
                "due_by_job", self._statements.due_by_job, {"now_at": now_at}
            )
        return {(module_id, job): int(count) for module_id, job, count in found}

    async def versions_by_job(self) -> dict[tuple[str, str], dict[int, int]]:
        async with self._operation("versions_by_job"):
            found = await self._executor.fetch(
                "versions_by_job", self._statements.versions_by_job, {}
            )
        counts: dict[tuple[str, str], dict[int, int]] = {}
        for module_id, job, version, runs in found:
            counts.setdefault((module_id, job), {})[int(version)] = int(runs)
        return counts

    def _change(self, run_id: str, change: RunChange) -> tuple[Any, dict[str, Any]]:
        """The conditional write that applies an operator's ``change``, and its values."""
        columns = tuple(name for name, _ in change.values)
        statement = self._shapes.of(change_statement, columns, change.leased)
        values = {f"new_{name}": value for name, value in change.values}
        return statement, values | {"run_id": run_id, "when_status": change.status}

    async def cancel(self, run_id: str, change: RunChange) -> bool:
        return await self._lone_write("cancel", *self._change(run_id, change))

    async def resume(self, run_id: str, change: RunChange) -> bool:
        statement, values = self._change(run_id, change)
        try:
            async with self._operation("resume"), self._executor.transaction("resume") as tx:
                if not await tx.fetch(statement, values):
                    return False
                await tx.fetch(self._statements.refill, values)
                return True
        except StoreError as error:
            if error.__cause__ is not None and self._executor.is_unique_violation(error.__cause__):
                raise JobConflictError(
                    f"run {run_id} cannot resume: another run of its key is live",
                    "job_run_key_live",
                ) from error.__cause__
            raise

    async def release(self, run_id: str, change: RunChange) -> bool:
        return await self._lone_write("release", *self._change(run_id, change))

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        if only_jobs is not None and not only_jobs:
            return 0
        only = None if only_jobs is None else sorted(only_jobs)
        excepted = sorted(except_jobs)
        shape = (len(statuses), None if only is None else len(only), len(excepted))
        doomed = self._shapes.of(prune_runs, *shape)
        values = {"ended_before": ended_before, "batch_size": batch_size}
        values |= numbered("pruned_status", statuses) | pairs("only_", only or [])
        values |= pairs("except_", excepted)
        # The runs first, each re-checked as it is deleted (a run resumed since the
        # batch was chosen is running again and stays), then the ledgers of exactly
        # the runs deleted: a resume can never keep its row and lose its ledger.
        deleted = 0
        while True:
            async with self._operation("prune"), self._executor.transaction("prune") as tx:
                ids = [row[0] for row in await tx.fetch(doomed, values)]
                if ids:
                    ledgers = self._shapes.of(prune_ledgers, len(ids))
                    await tx.fetch(ledgers, numbered("id", ids))
            deleted += len(ids)
            if len(ids) < batch_size:
                return deleted

    # -- OperatorStore: each job's own keep_for -------------------------------------------

    async def record_retention(
        self, keep_for_s: Mapping[tuple[str, str], int | None], at: str
    ) -> None:
        if not keep_for_s:
            return
        record = self._shapes.of(record_retention_statement, self._is_postgres)
        forget = self._shapes.of(forget_retention_statement)
        async with (
            self._operation("record_retention"),
            self._executor.transaction("record_retention") as transaction,
        ):
            for (module_id, job), seconds in sorted(keep_for_s.items()):
                key = {"kept_module_id": module_id, "kept_job": job}
                if seconds is None:
                    await transaction.fetch(forget, key)
                else:
                    values = key | {"keep_for_s": seconds, "updated_at": at}
                    await transaction.fetch(record, values)

    async def recorded_retention(self) -> dict[tuple[str, str], int]:
        statement = self._shapes.of(recorded_retention_statement)
        async with self._operation("recorded_retention"):
            rows = await self._executor.fetch("recorded_retention", statement, {})
        return {(row[0], row[1]): int(row[2]) for row in rows}

    # -- ScheduleStore: each schedule's progress --------------------------------------------

    async def schedule_rows(self) -> builtins.list[ScheduleRow]:
        statement = self._shapes.of(schedule_rows_statement)
        async with self._operation("schedule_rows"):
            rows = await self._executor.fetch("schedule_rows", statement, {})
        return [ScheduleRow(*row) for row in rows]

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        if not rows:
            return
        statement = self._shapes.of(add_schedule_statement, self._is_postgres)
        async with (
            self._operation("add_schedules"),
            self._executor.transaction("add_schedules") as transaction,
        ):
            for row in rows:
                await transaction.fetch(statement, _values("row_", row, SCHEDULE_COLUMNS))

    async def reset_schedule(self, schedule: ScheduleRow, stored_cron: str | None) -> bool:
        values = _slot_values(schedule) | {
            "new_last_slot_at": schedule.last_slot_at,
            "new_last_run_id": schedule.last_run_id,
            "new_updated_at": schedule.updated_at,
            "new_cron": schedule.cron,
            "old_cron": stored_cron,
        }
        statement = self._shapes.of(reset_schedule_statement)
        return await self._lone_write("reset_schedule", statement, values)

    async def remove_schedules(self, keys: Sequence[tuple[str, str, str]]) -> None:
        if not keys:
            return
        statement = self._shapes.of(remove_schedule_statement)
        async with (
            self._operation("remove_schedules"),
            self._executor.transaction("remove_schedules") as transaction,
        ):
            for module_id, job, schedule in keys:
                values = {"slot_module_id": module_id, "slot_job": job, "slot_schedule": schedule}
                await transaction.fetch(statement, values)

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        slot = _slot_values(schedule) | {
            "slot_cron": schedule.cron,
            "new_last_slot_at": schedule.last_slot_at,
            "new_last_run_id": row.id,
            "new_updated_at": schedule.updated_at,
        }
        values = self._start_values(row)
        async with (
            self._operation("start_slot"),
            self._executor.transaction("start_slot") as transaction,
        ):
            if not await transaction.fetch(self._shapes.of(take_slot_statement), slot):
                return None
            # The run is inserted in the same transaction as the slot is taken: a
            # crash between them loses both or neither.
            started = await self._start_in(transaction.fetch, row, values)
            if started is not None and not started[1]:
                slot["new_last_run_id"] = started[0].id
                await transaction.fetch(self._shapes.of(point_slot_statement), slot)
        if started is None:
            raise _kept_changing("start_slot")
        return started

    # -- the console's reads (jobrun._core.operator.browse.BrowsableStore) -------------------------

    def _selection(self, query: RunQuery) -> dict[str, Any]:
        """The values of ``query``'s conditions, named as ``statements.find_statement``
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

    # -- OperatorStore: the workers that said they are alive ----------------------------------

    async def beat_worker(self, row: WorkerRow, sweep_at: str | None = None) -> None:
        # One statement; with ``sweep_at``, a second deletes the rows of workers gone by then.
        beat = self._shapes.of(beat_worker_statement, self._is_postgres)
        values = {f"worker_{name}": getattr(row, name) for name in WORKER_FIELDS}
        async with self._operation("beat_worker"):
            await self._executor.fetch("beat_worker", beat, values)
            if sweep_at is not None:
                sweep = self._shapes.of(sweep_workers_statement)
                await self._executor.fetch("beat_worker", sweep, {"now_at": sweep_at})

    async def forget_worker(self, worker_id: str) -> None:
        statement = self._shapes.of(forget_worker_statement)
        async with self._operation("forget_worker"):
            await self._executor.fetch("forget_worker", statement, {"worker_id": worker_id})

    async def live_workers(self, now_at: str) -> builtins.list[WorkerRow]:
        statement = self._shapes.of(live_workers_statement)
        async with self._operation("live_workers"):
            rows = await self._executor.fetch("live_workers", statement, {"now_at": now_at})
        return [WorkerRow(*row) for row in rows]
