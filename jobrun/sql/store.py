"""``SqlJobRunStore``: the store port on SQLAlchemy Core, for SQLite and Postgres."""

from __future__ import annotations

import builtins
import hashlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from sqlalchemy import (
    Text,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobrun._core.browse import JobLoad, RunQuery
from jobrun._core.ids import first_id_at
from jobrun._core.port import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_STEP_RESULT_BYTES,
    StoreLimits,
)
from jobrun._core.records import (
    ClaimRequest,
    HealthCounts,
    HeldLease,
    JobRunStatus,
    RunFilter,
    RunPatch,
    RunRow,
    ScheduleRow,
    StepRow,
)
from jobrun._system import system_clock
from jobrun.errors import JobConflictError, SchemaOutdatedError, StoreError
from jobrun.sql.dialect import Dialect, DirectSqliteStatement
from jobrun.sql.presence import Presence, presence_held
from jobrun.sql.schema import (
    DUE_AT,
    LEASED_ONLY,
    LIVE_ONLY,
    SCHEMA_REVISION,
    job_runs,
    job_schedules,
    job_steps,
)
from jobrun.sql.tenancy import checked_schema, in_schema, notify_channel

RUNNING = JobRunStatus.RUNNING.value
FAILED = JobRunStatus.FAILED.value
_KEY = (job_runs.c.module_id, job_runs.c.job, job_runs.c.instance)
_START_RETRIES = 10
_NO_LEASE: dict[str, Any] = {"lease_owner": None, "lease_driver": None, "lease_began_at": None}
# Postgres: new runs are announced on ``notify_channel(schema)``, with ``notify_payload``.
_NOTIFY_MAX_BYTES = 7000  # Postgres refuses payloads of 8000 bytes and more
# How often the skew between this host's clock and Postgres's is measured again.
CLOCK_CHECK_INTERVAL_S = 60.0


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


def notify_payload(row: RunRow) -> str:
    """``["module_id", "job"]`` as JSON (a module id may itself contain ``/``); empty when
    too long for a notification (listeners then wake for any job)."""
    text = json.dumps([row.module_id, row.job])
    return text if len(text.encode("utf-8")) <= _NOTIFY_MAX_BYTES else ""


_PATCH_COLUMNS = tuple(RunPatch.__dataclass_fields__)
_STEP_COLUMNS = ("run_id", "step", "result", "attempts", "last_error", "recorded_at")


def _fence() -> Any:
    """``this run, still running, still held by this token``, as bound parameters."""
    return and_(
        job_runs.c.id == bindparam("fence_id"),
        job_runs.c.status == RUNNING,
        job_runs.c.lease_owner == bindparam("fence_token"),
    )


def _fence_values(run_id: str, token: str) -> dict[str, Any]:
    return {"fence_id": run_id, "fence_token": token}


def _patch_values(patch: RunPatch) -> dict[str, Any]:
    return {f"new_{name}": getattr(patch, name) for name in _PATCH_COLUMNS}


class _HotStatements:
    """The step and pass path's statements, built once with bound parameters.

    Building a statement per call and letting SQLAlchemy compute its cache key
    again cost about a fifth of a step's CPU in the first benchmark.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.get = select(job_runs).where(job_runs.c.id == bindparam("run_id"))
        self.steps = select(
            job_steps.c.step, job_steps.c.result, job_steps.c.attempts, job_steps.c.last_error
        ).where(job_steps.c.run_id == bindparam("run_id"))
        self.patch = (
            update(job_runs)
            .where(_fence())
            .values({name: bindparam(f"new_{name}") for name in _PATCH_COLUMNS})
        )
        self.extend_lease = (
            update(job_runs).where(_fence()).values(next_attempt_at=bindparam("expires_at"))
        )
        self.drop_ledger = delete(job_steps).where(job_steps.c.run_id == bindparam("fence_id"))
        # Postgres: the commit in one statement, so one round trip and atomic by
        # itself; the ledger is dropped only if the fenced write applied.
        written = self.patch.returning(job_runs.c.id).cte("written")
        dropped = (
            delete(job_steps)
            .where(job_steps.c.run_id.in_(select(written.c.id)))
            .cte("dropped_ledger")
        )
        self.commit_in_one = select(written.c.id).add_cte(dropped)
        held = select(literal(1)).where(_fence())
        if dialect.is_postgres:
            # Lock the run row for the statement: a claim that would take the run
            # over waits until this write is done, so check and write cannot split.
            held = held.with_for_update(read=True)
        values = select(
            *(bindparam(f"step_{name}", type_=job_steps.c[name].type) for name in _STEP_COLUMNS)
        ).where(exists(held))
        upsert = dialect.insert(job_steps).from_select(list(_STEP_COLUMNS), values)
        self.record_step = upsert.on_conflict_do_update(
            index_elements=[job_steps.c.run_id, job_steps.c.step],
            set_={name: upsert.excluded[name] for name in _STEP_COLUMNS[2:]},
        )


class _DirectStatements:
    """SQLite: the hot statements, compiled once for ``DirectSqliteStatement``."""

    def __init__(self, engine: AsyncEngine, hot: _HotStatements) -> None:
        self.record_step = DirectSqliteStatement(engine, hot.record_step.returning(literal(1)))
        self.steps = DirectSqliteStatement(engine, hot.steps)
        self.patch = DirectSqliteStatement(engine, hot.patch.returning(job_runs.c.id))
        self.drop_ledger = DirectSqliteStatement(engine, hot.drop_ledger)


def _run_row(mapping: Any) -> RunRow:
    return RunRow(**mapping)


def _in_flight(module_id: str, job: str, now_at: str) -> Any:
    """How many runs of one job hold a lease that has not expired (a separate alias:
    the count must not correlate with the claim's candidate row)."""
    leased = job_runs.alias("leased")
    return (
        select(func.count())
        .select_from(leased)
        .where(
            # Spelled as the partial index's predicate, so both engines use it.
            LEASED_ONLY,
            leased.c.module_id == module_id,
            leased.c.job == job,
            leased.c.status == RUNNING,
            leased.c.next_attempt_at > now_at,
        )
        .scalar_subquery()
    )


def _due_candidate(request: ClaimRequest) -> Any:
    """The first due run in claim order, among the requested jobs under their limits."""
    runs = job_runs.c
    candidate = (
        select(runs.id)
        .where(
            runs.status == RUNNING,
            request.now_at >= DUE_AT,
            tuple_(runs.module_id, runs.job).in_(list(request.expires_at)),
        )
        .order_by(runs.priority.desc(), DUE_AT, runs.id)
        .limit(1)
        # Postgres: concurrent claimers pass over each other's rows instead of
        # queueing on them. SQLite renders nothing here: its single write
        # statement holds the database's write lock from before its read.
        .with_for_update(skip_locked=True)
    )
    for (module_id, job), most in sorted(request.max_concurrent.items()):
        if (module_id, job) in request.expires_at:
            # Uncorrelated, so evaluated once per claim, not once per candidate row.
            candidate = candidate.where(
                or_(
                    runs.module_id != module_id,
                    runs.job != job,
                    _in_flight(module_id, job, request.now_at) < most,
                )
            )
    if request.skip_ids:
        candidate = candidate.where(runs.id.not_in(sorted(request.skip_ids)))
    return candidate.scalar_subquery()


def _orphan_candidate(request: ClaimRequest) -> Any:
    """A run whose holder was proven dead, due or not (see ``jobrun._core.holders``).

    Taking it over adds no pass in flight, so per-job limits do not apply.
    """
    runs = job_runs.c
    return (
        select(runs.id)
        .where(
            runs.status == RUNNING,
            runs.lease_owner.in_(sorted(request.dead_owners)),
            # Unexpired (once expired it is simply due): the due index's range.
            request.now_at < DUE_AT,
            tuple_(runs.module_id, runs.job).in_(list(request.expires_at)),
        )
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )


def _takeover_reason(request: ClaimRequest) -> Any:
    """``last_error`` after the claim: why the run was taken over, if its pass had begun."""
    runs = job_runs.c
    began = and_(runs.lease_owner.is_not(None), runs.lease_began_at.is_not(None))
    reasons = [
        (
            began,
            literal("the lease of driver ", Text)
            + runs.lease_driver
            + literal(" expired during a pass; the run was taken over", Text),
        )
    ]
    if request.dead_owners:
        died = runs.lease_owner.in_(sorted(request.dead_owners))
        death = literal(" died during a pass; the run was taken over at once", Text)
        reasons.insert(
            0, (and_(began, died), literal("the driver ", Text) + runs.lease_driver + death)
        )
    return case(*reasons, else_=runs.last_error)


def _claim_statement(request: ClaimRequest) -> Any:
    """The claim: one UPDATE that picks a dead holder's run, else the first due run in
    claim order, and leases it."""
    runs = job_runs.c
    chosen: Any = _due_candidate(request)
    if request.dead_owners:
        chosen = func.coalesce(_orphan_candidate(request), chosen)
    expiries = set(request.expires_at.values())
    if len(expiries) == 1:
        expiry: Any = next(iter(expiries))
    else:
        expiry = case(
            *(
                (and_(runs.module_id == module_id, runs.job == job), expires_at)
                for (module_id, job), expires_at in request.expires_at.items()
            ),
        )
    # The previous lease is still on the row only when it expired or its holder
    # died: a takeover.
    taken_over = runs.lease_owner.is_not(None)
    began = and_(taken_over, runs.lease_began_at.is_not(None))
    return (
        update(job_runs)
        .where(runs.id == chosen)
        .values(
            lease_owner=request.token,
            lease_driver=request.driver,
            lease_began_at=request.now_at,
            next_attempt_at=expiry,
            lease_takeovers=runs.lease_takeovers + case((taken_over, 1), else_=0),
            attempts=runs.attempts + case((began, 1), else_=0),
            last_error=_takeover_reason(request),
        )
        .returning(*job_runs.c)
    )


def limit_lock_key(schema: str | None, module_id: str, job: str) -> int:
    """Postgres: the advisory lock (a signed 64-bit key) that orders one job's limited
    claims; per schema, so tenants never wait on each other."""
    digest = hashlib.blake2b(
        json.dumps(["jobrun.max_concurrent", schema, module_id, job]).encode("utf-8"),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def _limit_locks(schema: str | None, jobs: list[tuple[str, str]]) -> Any:
    # Always in the same (sorted) order, so two claimers cannot deadlock.
    keys = sorted(limit_lock_key(schema, module_id, job) for module_id, job in jobs)
    return select(*(func.pg_advisory_xact_lock(key) for key in keys))


class SqlJobRunStore:
    """Runs and step ledgers in a SQLite or Postgres database reached through ``engine``.

    Works with a plain engine: on SQLite it turns on WAL and a busy timeout for
    the connections it uses. The schema must have been created with
    :func:`jobrun.upgrade`; the first operation checks that, once. On Postgres,
    ``schema`` names the tenant's schema that ``jobrun.upgrade(engine, schema=...)``
    put the tables in; ``engine`` itself is left as it is.
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
    ) -> None:
        if not isinstance(engine, AsyncEngine):
            raise TypeError(
                "SqlJobRunStore needs an AsyncEngine (from create_async_engine), "
                f"got {type(engine).__name__}"
            )
        self._host_engine = engine
        self._schema = checked_schema(engine, schema)
        # Every statement below goes through this engine: in a schema, a copy whose
        # translate map puts jobrun's tables there.
        engine = self._engine = in_schema(engine, self._schema)
        self._limits = StoreLimits(
            max_payload_bytes=max_payload_bytes,
            max_cursor_bytes=max_payload_bytes if max_cursor_bytes is None else max_cursor_bytes,
            max_step_result_bytes=max_step_result_bytes,
            max_counters_bytes=max_counters_bytes,
        )
        self._dialect = Dialect(engine, sqlite_busy_timeout_ms=sqlite_busy_timeout_ms)
        self._schema_checked = False
        self._hot = _HotStatements(self._dialect)
        # SQLite: the per-step and per-pass statements skip SQLAlchemy's transaction
        # and go straight to aiosqlite (a step write: 2 driver hops, not 5).
        self._direct: _DirectStatements | None = (
            _DirectStatements(engine, self._hot) if DirectSqliteStatement.usable(engine) else None
        )
        self._insert_run = self._dialect.insert(job_runs).on_conflict_do_nothing(
            index_elements=list(_KEY), index_where=LIVE_ONLY
        )
        self._presence = (
            # The host's own engine: its dispose is what lets go of the presence.
            Presence(self._host_engine)
            if self._dialect.is_postgres and engine.dialect.driver == "asyncpg"
            else None
        )
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

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    @property
    def default_scope(self) -> object:
        return self._host_engine

    @asynccontextmanager
    async def _operation(self, name: str) -> AsyncIterator[None]:
        """Translate driver and database errors into StoreError, once, here."""
        try:
            if not self._schema_checked:
                await self._check_schema()
            yield
        except (SQLAlchemyError, OSError, sqlite3.Error) as error:
            raise StoreError(name, error) from error

    async def _check_schema(self) -> None:
        # One read per store lifetime, so that a database nobody upgraded fails
        # with the command to run rather than "no such table".
        from jobrun.sql.migrate import current_revision

        async with self._engine.connect() as connection:
            found = await connection.run_sync(current_revision, self._schema)
        # Revision ids are zero-padded numbers, so text order is revision order.
        if found is None or found < SCHEMA_REVISION:
            raise SchemaOutdatedError(found, SCHEMA_REVISION)
        self._schema_checked = True

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        values = asdict(row)
        live = select(job_runs).where(
            job_runs.c.module_id == row.module_id,
            job_runs.c.job == row.job,
            job_runs.c.instance == row.instance,
            job_runs.c.status == RUNNING,
        )
        async with self._operation("start_or_join"):
            for _ in range(_START_RETRIES):
                async with self._dialect.single_statement() as connection:
                    # The partial unique index decides: at most one live row per key,
                    # whatever number of hosts race here.
                    insert = self._insert_run.values(values)
                    if self._dialect.is_postgres:
                        # Wake listening workers (``jobrun worker``) now rather than at
                        # their next poll: the NOTIFY rides in the insert's statement and
                        # is sent only when a row was inserted, so a start stays one
                        # round trip.
                        added = insert.returning(job_runs.c.id).cte("added")
                        announce = select(
                            func.pg_notify(notify_channel(self._schema), notify_payload(row))
                        ).select_from(added)
                        was_inserted = (await connection.execute(announce)).first() is not None
                    else:
                        was_inserted = (await connection.execute(insert)).rowcount == 1
                    if was_inserted:
                        return row, True
                    found = (await connection.execute(live)).mappings().first()
                if found is not None:
                    return _run_row(found), False
                # The live run ended between our insert and our read: try again.
        raise StoreError("start_or_join", RuntimeError("the key's live run kept changing; gave up"))

    async def get(self, run_id: str) -> RunRow | None:
        async with self._operation("get"), self._dialect.reading() as connection:
            result = await connection.execute(self._hot.get, {"run_id": run_id})
            found = result.mappings().first()
        return None if found is None else _run_row(found)

    async def claim(self, request: ClaimRequest) -> RunRow | None:
        if not request.expires_at:
            return None
        statement = _claim_statement(request)
        limited = sorted(key for key in request.max_concurrent if key in request.expires_at)
        async with self._operation("claim"):
            if limited and self._dialect.is_postgres:
                # Under READ COMMITTED two claimers could both count "1 below a limit
                # of 2" and both lease. A transaction-scoped advisory lock per limited
                # job, taken in a statement of its own, makes them count one after
                # the other: the claim's statement, run after the lock, sees every
                # lease committed before it. Jobs without a limit never pay this.
                async with self._engine.begin() as connection:
                    await connection.execute(_limit_locks(self._schema, limited))
                    found = (await connection.execute(statement)).mappings().first()
            else:
                # One statement, one round trip: choosing and leasing cannot come
                # apart. On SQLite it holds the write lock from before its read, so
                # a limit's count cannot change under it either.
                async with self._dialect.single_statement() as connection:
                    found = (await connection.execute(statement)).mappings().first()
        return None if found is None else _run_row(found)

    async def schedule_rows(self) -> list[ScheduleRow]:
        query = select(job_schedules).order_by(*job_schedules.primary_key.columns)
        async with self._operation("schedule_rows"), self._dialect.reading() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [ScheduleRow(**row) for row in rows]

    async def add_schedules(self, rows: Sequence[ScheduleRow]) -> None:
        if not rows:
            return
        statement = self._dialect.insert(job_schedules).on_conflict_do_nothing(
            index_elements=list(job_schedules.primary_key.columns)
        )
        async with self._operation("add_schedules"), self._dialect.single_statement() as connection:
            await connection.execute(statement, [asdict(row) for row in rows])

    async def start_slot(self, schedule: ScheduleRow, row: RunRow) -> tuple[RunRow, bool] | None:
        slots = job_schedules.c
        key = and_(
            slots.module_id == schedule.module_id,
            slots.job == schedule.job,
            slots.schedule == schedule.schedule,
        )
        # The conditional write that picks the one caller who starts this slot: on
        # Postgres a second caller waits on the row, then finds the slot taken.
        take = (
            update(job_schedules)
            .where(key, slots.last_slot_at < schedule.last_slot_at)
            .values(
                last_slot_at=schedule.last_slot_at,
                last_run_id=row.id,
                updated_at=schedule.updated_at,
            )
        )
        live = select(job_runs).where(
            job_runs.c.module_id == row.module_id,
            job_runs.c.job == row.job,
            job_runs.c.instance == row.instance,
            job_runs.c.status == RUNNING,
        )
        async with self._operation("start_slot"), self._engine.begin() as connection:
            if (await connection.execute(take)).rowcount != 1:
                return None
            # The run is inserted in the same transaction as the slot is taken: a
            # crash between them loses both or neither.
            for _ in range(_START_RETRIES):
                if await self._insert_announced(connection, row):
                    return row, True
                found = (await connection.execute(live)).mappings().first()
                if found is not None:
                    await connection.execute(
                        update(job_schedules).where(key).values(last_run_id=found["id"])
                    )
                    return _run_row(found), False
        raise StoreError("start_slot", RuntimeError("the key's live run kept changing; gave up"))

    async def _insert_announced(self, connection: AsyncConnection, row: RunRow) -> bool:
        """Insert ``row`` unless its key is live; on Postgres also NOTIFY (sent at commit)."""
        insert = self._insert_run.values(asdict(row))
        if not self._dialect.is_postgres:
            return bool((await connection.execute(insert)).rowcount == 1)
        added = insert.returning(job_runs.c.id).cte("added")
        announce = select(
            func.pg_notify(notify_channel(self._schema), notify_payload(row))
        ).select_from(added)
        return (await connection.execute(announce)).first() is not None

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> list[HeldLease]:
        runs = job_runs.c
        held = presence_held() if self._presence is not None else literal(None)
        query = select(
            runs.id,
            runs.module_id,
            runs.job,
            runs.lease_owner,
            runs.lease_driver,
            runs.lease_began_at,
            held,
        ).where(
            runs.status == RUNNING,
            runs.lease_owner.is_not(None),
            # Not expired: a held lease's expiry is its due instant (the index's range).
            now_at < DUE_AT,
        )
        if jobs is not None:
            if not jobs:
                return []
            query = query.where(tuple_(runs.module_id, runs.job).in_(sorted(jobs)))
        async with self._operation("held_leases"), self._dialect.reading() as connection:
            rows = (await connection.execute(query)).all()
        return [HeldLease(*row) for row in rows]

    async def presence(self) -> int | None:
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.key()

    async def presence_connection(self) -> Any:
        """Postgres (asyncpg): the presence's own connection, which ``jobrun.worker``
        also LISTENs on; ``None`` elsewhere."""
        if self._presence is None:
            return None
        async with self._operation("presence"):
            return await self._presence.connection()

    async def clock_offset_s(self) -> float:
        if not self._dialect.is_postgres:
            return 0.0
        cached = self._clock_offset
        if cached is not None and time.monotonic() - cached[0] < CLOCK_CHECK_INTERVAL_S:
            return cached[1]
        async with self._operation("clock_offset"), self._dialect.reading() as connection:
            sent = system_clock().timestamp()
            database_now = (await connection.execute(select(func.clock_timestamp()))).scalar_one()
            received = system_clock().timestamp()
        # The database read its clock about halfway through the round trip.
        offset = float(database_now.timestamp()) - (sent + received) / 2
        self._clock_offset = (time.monotonic(), offset)
        return offset

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        conditions = [
            column == value
            for column, value in (
                (job_runs.c.module_id, run_filter.module_id),
                (job_runs.c.job, run_filter.job),
                (job_runs.c.instance, run_filter.instance),
                (job_runs.c.status, run_filter.status),
            )
            if value is not None
        ]
        query = (
            select(job_runs)
            .where(and_(True, *conditions))
            .order_by(job_runs.c.id.desc())
            .limit(run_filter.limit)
        )
        async with self._operation("list"), self._dialect.reading() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [_run_row(row) for row in rows]

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = _fence_values(run_id, token) | _patch_values(patch)
        async with self._operation("patch"), self._dialect.single_statement() as connection:
            return (await connection.execute(self._hot.patch, values)).rowcount == 1

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> bool:
        values = _fence_values(run_id, token) | _patch_values(patch)
        async with self._operation("commit_pass"):
            if self._dialect.is_postgres:
                async with self._dialect.single_statement() as connection:
                    result = await connection.execute(self._hot.commit_in_one, values)
                    return result.first() is not None
            # SQLite has no data-modifying CTEs: two statements, one transaction.
            direct = self._direct
            if direct is not None and not direct.patch.observed():
                async with self._engine.connect() as connection:
                    return await direct.patch.fetch_in_transaction(
                        connection, values, direct.drop_ledger
                    )
            async with self._engine.begin() as connection:
                if (await connection.execute(self._hot.patch, values)).rowcount != 1:
                    return False
                await connection.execute(self._hot.drop_ledger, values)
                return True

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        direct = self._direct
        if direct is not None and not direct.steps.observed():
            async with self._operation("steps"), self._engine.connect() as connection:
                found = await direct.steps.fetch(connection, {"run_id": run_id})
            return {row[0]: StepRow(*row) for row in found}
        async with self._operation("steps"), self._dialect.reading() as connection:
            rows = (await connection.execute(self._hot.steps, {"run_id": run_id})).all()
        return {
            row.step: StepRow(row.step, row.result, row.attempts, row.last_error) for row in rows
        }

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        values = _fence_values(run_id, token) | {
            "step_run_id": run_id,
            "step_step": row.step,
            "step_result": row.result,
            "step_attempts": row.attempts,
            "step_last_error": row.last_error,
            "step_recorded_at": recorded_at,
        }
        direct = self._direct
        if direct is not None and not direct.record_step.observed():
            async with self._operation("record_step"), self._engine.connect() as connection:
                return len(await direct.record_step.fetch(connection, values)) == 1
        async with self._operation("record_step"), self._dialect.single_statement() as connection:
            # The one write that makes a step durable: one round trip on Postgres.
            return (await connection.execute(self._hot.record_step, values)).rowcount == 1

    async def extend_lease(self, run_id: str, token: str, expires_at: str) -> bool:
        values = _fence_values(run_id, token) | {"expires_at": expires_at}
        async with self._operation("extend_lease"), self._dialect.single_statement() as connection:
            return (await connection.execute(self._hot.extend_lease, values)).rowcount == 1

    async def cancel(self, run_id: str, reason: str, at: str) -> bool:
        statement = (
            update(job_runs)
            .where(job_runs.c.id == run_id, job_runs.c.status == RUNNING)
            .values(
                status=FAILED,
                last_error=reason,
                updated_at=at,
                ended_at=at,
                next_attempt_at=None,
                **_NO_LEASE,
            )
        )
        async with self._operation("cancel"), self._dialect.single_statement() as connection:
            return (await connection.execute(statement)).rowcount == 1

    async def resume(self, run_id: str, at: str, *, counters: str | None = None) -> bool:
        repair = {} if counters is None else {"counters": counters}
        revive = (
            update(job_runs)
            .where(job_runs.c.id == run_id, job_runs.c.status == FAILED)
            .values(
                status=RUNNING,
                attempts=0,
                lease_takeovers=0,
                updated_at=at,
                ended_at=None,
                next_attempt_at=None,
                **_NO_LEASE,
                **repair,
            )
        )
        # Failed steps get their attempts back; completed ones keep their memo.
        refill = (
            update(job_steps)
            .where(job_steps.c.run_id == run_id, job_steps.c.result.is_(None))
            .values(attempts=0)
        )
        try:
            async with self._operation("resume"), self._engine.begin() as connection:
                if (await connection.execute(revive)).rowcount != 1:
                    return False
                await connection.execute(refill)
                return True
        except StoreError as error:
            if isinstance(error.__cause__, IntegrityError):
                raise JobConflictError(
                    f"run {run_id} cannot resume: another run of its key is live",
                    "job_run_key_live",
                ) from error.__cause__
            raise

    async def release(self, run_id: str) -> bool:
        statement = (
            update(job_runs)
            .where(
                job_runs.c.id == run_id,
                job_runs.c.status == RUNNING,
                job_runs.c.lease_owner.is_not(None),
            )
            .values(next_attempt_at=None, **_NO_LEASE)
        )
        async with self._operation("release"), self._dialect.single_statement() as connection:
            return (await connection.execute(statement)).rowcount == 1

    async def health(self, now_at: str) -> HealthCounts:
        runs = job_runs.c
        live = runs.status == RUNNING
        # Due includes the stranded: a lease that expired is due since its expiry.
        waiting = and_(live, now_at >= DUE_AT)
        # Finished runs are kept forever; every filter here leads with status so
        # the history is never scanned (done runs are not counted at all).
        query = select(
            func.count().filter(live),
            func.count().filter(waiting),
            func.count().filter(and_(live, runs.lease_owner.is_not(None), now_at < DUE_AT)),
            func.count().filter(runs.status == FAILED),
            func.min(DUE_AT).filter(waiting),
        ).where(runs.status.in_([RUNNING, FAILED]))
        async with self._operation("health"), self._dialect.reading() as connection:
            row = (await connection.execute(query)).one()
        return HealthCounts(int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4])

    async def due_by_job(self, now_at: str) -> dict[tuple[str, str], int]:
        runs = job_runs.c
        # The running range of the claim-order index (status leads it).
        query = (
            select(runs.module_id, runs.job, func.count())
            .where(runs.status == RUNNING, now_at >= DUE_AT, runs.lease_owner.is_(None))
            .group_by(runs.module_id, runs.job)
        )
        async with self._operation("due_by_job"), self._dialect.reading() as connection:
            found = (await connection.execute(query)).all()
        return {(module_id, job): int(count) for module_id, job, count in found}

    async def prune(
        self,
        ended_before: str,
        statuses: tuple[str, ...],
        batch_size: int,
        *,
        only_jobs: frozenset[tuple[str, str]] | None = None,
        except_jobs: frozenset[tuple[str, str]] = frozenset(),
    ) -> int:
        runs = job_runs.c
        doomed = (
            select(runs.id)
            .where(runs.status.in_(statuses), runs.status != RUNNING, runs.ended_at < ended_before)
            .order_by(runs.id)
            .limit(batch_size)
        )
        job_key = tuple_(job_runs.c.module_id, job_runs.c.job)
        if only_jobs is not None:
            if not only_jobs:
                return 0
            doomed = doomed.where(job_key.in_(sorted(only_jobs)))
        if except_jobs:
            doomed = doomed.where(job_key.not_in(sorted(except_jobs)))
        # The runs first, each re-checked as it is deleted (a run resumed since the
        # batch was chosen is running again and stays), then the ledgers of exactly
        # the runs deleted: a resume can never keep its row and lose its ledger.
        delete_runs = (
            delete(job_runs).where(runs.id.in_(doomed), runs.status != RUNNING).returning(runs.id)
        )
        deleted = 0
        while True:
            async with self._operation("prune"), self._engine.begin() as connection:
                ids = list((await connection.execute(delete_runs)).scalars())
                if ids:
                    await connection.execute(delete(job_steps).where(job_steps.c.run_id.in_(ids)))
            deleted += len(ids)
            if len(ids) < batch_size:
                return deleted

    # -- the console's reads (jobrun._core.browse.BrowsableStore) ---------------------------

    @staticmethod
    def _stranded(now_at: str) -> Any:
        """Mirror of :func:`jobrun._core.browse.is_stranded`: leased, lease expired."""
        runs = job_runs.c
        return and_(
            runs.status == RUNNING,
            runs.lease_owner.is_not(None),
            runs.next_attempt_at < now_at,
        )

    def _selected(self, query: RunQuery) -> tuple[Any, ...]:
        runs = job_runs.c
        conditions: builtins.list[Any] = []
        if query.module_id is not None:
            conditions.append(runs.module_id == query.module_id)
        if query.job is not None:
            conditions.append(runs.job == query.job)
        if query.instance_prefix:
            conditions.extend(self._prefixed(query.instance_prefix))
        if query.statuses:
            conditions.append(runs.status.in_(query.statuses))
        if query.started_since_at is not None:
            # The id bound is the index-friendly half (see RunQuery): a range on
            # every index that ends in id, so the pages and counts seek.
            conditions.append(runs.started_at >= query.started_since_at)
            conditions.append(runs.id >= first_id_at(query.started_since_at))
        if query.stranded_at is not None:
            conditions.append(self._stranded(query.stranded_at))
        if query.before_id is not None:
            conditions.append(runs.id < query.before_id)
        return tuple(conditions)

    def _prefixed(self, prefix: str) -> builtins.list[Any]:
        # substr, not LIKE: LIKE is case-blind on SQLite and treats % and _ specially.
        exact = func.substr(job_runs.c.instance, 1, len(prefix)) == prefix
        if self._dialect.is_postgres:
            # A range is a superset of the prefix only under a bytewise collation,
            # which a Postgres database need not have.
            return [exact]
        # SQLite compares text bytewise: the range lets the key index seek within a job.
        bounds = [exact, job_runs.c.instance >= prefix]
        upper = _prefix_successor(prefix)
        if upper is not None:
            bounds.append(job_runs.c.instance < upper)
        return bounds

    async def find(self, query: RunQuery) -> builtins.list[RunRow]:
        # Newest first down an index ending in id, stopped by the limit: a page costs
        # the same on the first and the thousandth page, however many runs are kept.
        conditions = self._selected(query)
        arms = _status_arms(query)
        if len(arms) > 1:
            # Each status reads its own id-ordered range of (module_id, job, status, id)
            # or (status, id), stopped by the limit; the few rows are merged here.
            pieces = [
                select(job_runs)
                .where(*conditions, job_runs.c.status == status)
                .order_by(job_runs.c.id.desc())
                .limit(query.limit)
                .subquery()
                for status in arms
            ]
            merged = union_all(*(select(piece) for piece in pieces)).subquery()
            statement = select(merged).order_by(merged.c.id.desc()).limit(query.limit)
        else:
            statement = (
                select(job_runs)
                .where(and_(True, *conditions))
                .order_by(job_runs.c.id.desc())
                .limit(query.limit)
            )
        async with self._operation("find"), self._dialect.reading() as connection:
            rows = (await connection.execute(statement)).mappings().all()
        return [_run_row(row) for row in rows]

    async def count(self, query: RunQuery, cap: int) -> int:
        # The LIMIT inside bounds the work: at most ``cap`` index entries are read.
        capped = select(literal(1)).where(and_(True, *self._selected(query))).limit(cap)
        statement = select(func.count()).select_from(capped.subquery())
        async with self._operation("count"), self._dialect.reading() as connection:
            return int((await connection.execute(statement)).scalar_one())

    async def job_loads(self, now_at: str, failed_since_at: str) -> builtins.list[JobLoad]:
        runs = job_runs.c
        live = runs.status == RUNNING
        waiting = and_(live, runs.lease_owner.is_(None), now_at >= DUE_AT)
        failed = and_(runs.status == FAILED, runs.ended_at >= failed_since_at)
        statement = (
            select(
                runs.module_id,
                runs.job,
                func.count().filter(live),
                func.count().filter(waiting),
                func.min(DUE_AT).filter(waiting),
                func.count().filter(self._stranded(now_at)),
                func.count().filter(failed),
            )
            # Status leads, as in health(): finished history is not scanned.
            .where(runs.status.in_([RUNNING, FAILED]), live | failed)
            .group_by(runs.module_id, runs.job)
            .order_by(runs.module_id, runs.job)
        )
        async with self._operation("job_loads"), self._dialect.reading() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            JobLoad(row[0], row[1], int(row[2]), int(row[3]), row[4], int(row[5]), int(row[6]))
            for row in rows
        ]
