"""``SqlJobRunStore``: the store port on SQLAlchemy Core, for SQLite and Postgres.

The store is built from one class per facet of the port (:mod:`jobrun._core.port`),
each in its own file beside this one, with its statements in the file of the same
name in :mod:`jobrun.sql.statements`:

* :mod:`~jobrun.sql.store.runs`: starts, the pass's reads and writes (``JobRunStore``);
* :mod:`~jobrun.sql.store.claims`: the claim, one statement per batch on Postgres;
* :mod:`~jobrun.sql.store.leases`: held leases, their renewal, the presence, the
  database's clock;
* :mod:`~jobrun.sql.store.limits`: rate-limit buckets and concurrency slots;
* :mod:`~jobrun.sql.store.operator`: what operators do by hand, health, pruning,
  retention, the workers' rows (``OperatorStore``);
* :mod:`~jobrun.sql.store.pauses`: pause and unpause of a run, a job, a limit key;
* :mod:`~jobrun.sql.store.schedules`: each schedule's progress (``ScheduleStore``);
* :mod:`~jobrun.sql.store.browse`: the listing and the console's reads
  (:mod:`jobrun._core.operator.browse`).

What they share, and what every operation goes through (the schema check, the
error translation), is :mod:`~jobrun.sql.store.base`. Every operation binds its
statement's values and sends it through the store's one executor
(:mod:`jobrun.sql.executor`); round trips per operation are listed in
``docs/design.md`` ("Round trips").
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_STEP_RESULT_BYTES,
    KeptForDrives,
    StoreLimits,
    refuse_type,
    type_name,
)
from jobrun.sql.executor import StatementHook, executor_for
from jobrun.sql.postgres.database_clock import DatabaseClockLeases
from jobrun.sql.postgres.presence import Presence
from jobrun.sql.postgres.tenancy import checked_schema, in_schema
from jobrun.sql.sqlite_setup import configure_sqlite
from jobrun.sql.start_batches import StartBatches
from jobrun.sql.store.base import compiled_for
from jobrun.sql.store.browse import SqlBrowse
from jobrun.sql.store.claims import SqlClaims, limit_lock_key
from jobrun.sql.store.leases import SqlLeases
from jobrun.sql.store.limits import SqlLimits
from jobrun.sql.store.operator import SqlOperator
from jobrun.sql.store.pauses import SqlPauses
from jobrun.sql.store.runs import SqlRuns, notify_payload
from jobrun.sql.store.schedules import SqlSchedules

__all__ = ["SqlJobRunStore", "limit_lock_key", "notify_payload"]


class SqlJobRunStore(
    SqlRuns,
    SqlClaims,
    SqlLeases,
    SqlLimits,
    SqlOperator,
    SqlPauses,
    SqlSchedules,
    SqlBrowse,
    KeptForDrives,
):
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
        limits = StoreLimits(
            max_payload_bytes=max_payload_bytes,
            max_cursor_bytes=max_payload_bytes if max_cursor_bytes is None else max_cursor_bytes,
            max_step_result_bytes=max_step_result_bytes,
            max_counters_bytes=max_counters_bytes,
        )
        # What every drive of this database shares; the host's engine is the default scope.
        KeptForDrives.__init__(self, limits, engine)
        self._executor = executor_for(engine, statement_hook)
        self._is_postgres = engine.dialect.name == "postgresql"
        self._bytewise_text = None if self._is_postgres else True
        if not self._is_postgres:
            configure_sqlite(engine, sqlite_busy_timeout_ms)
        self._statements, self._operator_statements, self._shapes = compiled_for(
            engine, self._schema
        )
        self._schema_checked = False
        self._start_batches = StartBatches(self._start_batch)
        # Postgres: the host's own engine, whose dispose is what lets go of the presence.
        self._presence = Presence(self._host_engine) if self._is_postgres else None
        self._database_clock_leases = DatabaseClockLeases()
        self._clock_offset = None

    @property
    def engine(self) -> AsyncEngine:
        """The engine this store was made with (the host owns and disposes of it)."""
        return self._host_engine

    @property
    def schema(self) -> str | None:
        """The Postgres schema holding jobrun's tables, or ``None`` for the default."""
        return self._schema
