"""What every facet of ``SqlJobRunStore`` shares: its state, and what each operation goes through.

The facets (runs, claims, leases, limits, operator, schedules, browse: one class a
file) are parts of one store object, so each is a subclass of
:class:`SqlStoreBase`, which declares the state they share (set once, by
``SqlJobRunStore.__init__``) and the one path every operation takes: the schema
check at the first operation, and driver and database errors translated into
:class:`~jobrun.errors.StoreError`, once. A facet declares the state only it
uses in its own class. The helpers that name a statement's values live here too,
so two facets never spell them twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.errors import StoreError
from jobrun.sql.executor import Compiler, Executor
from jobrun.sql.postgres.database_clock import DatabaseClockLeases
from jobrun.sql.postgres.presence import PresenceNotHeld
from jobrun.sql.schema import SCHEMA_REVISION
from jobrun.sql.statements.compiled import Shapes
from jobrun.sql.statements.operator import OperatorStatements
from jobrun.sql.statements.runs import RunStatements

Fetch = Callable[[Any, Mapping[str, Any]], Awaitable[list[Any]]]
"""Sends one prepared statement with its values: the executor's, or a transaction's."""


def pairs(prefix: str, jobs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``{prefix}module_{i}`` and ``{prefix}job_{i}`` of each ``(module_id, job)`` pair."""
    values: dict[str, Any] = {}
    for index, (module_id, job) in enumerate(jobs):
        values |= {f"{prefix}module_{index}": module_id, f"{prefix}job_{index}": job}
    return values


def numbered(name: str, items: Sequence[Any]) -> dict[str, Any]:
    """``{name}_{i}`` of each item."""
    return {f"{name}_{index}": item for index, item in enumerate(items)}


def prefixed_values(prefix: str, record: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``{prefix}{name}`` of each of ``record``'s fields ``names``."""
    # getattr, not dataclasses.astuple: that deep-copies every field (a pass commit pays it).
    return {f"{prefix}{name}": getattr(record, name) for name in names}


def fence_values(run_id: str, token: str) -> dict[str, Any]:
    """The fence of a holder's write: this run, still held by this token."""
    return {"fence_id": run_id, "fence_token": token}


def kept_changing(operation: str) -> StoreError:
    """A start that found the key's live run ending every time it looked."""
    return StoreError(operation, RuntimeError("the key's live run kept changing; gave up"))


# Compiled statements by dialect and schema: a worker over a thousand databases makes
# a thousand stores, and compiling the fixed statements takes tens of ms per store.
_COMPILED: dict[tuple[Any, ...], tuple[RunStatements, OperatorStatements, Shapes]] = {}


def compiled_for(
    engine: AsyncEngine, schema: str | None
) -> tuple[RunStatements, OperatorStatements, Shapes]:
    """The fixed statements and the shapes of ``engine``'s dialect in ``schema``."""
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
        found = _COMPILED[key] = (
            RunStatements(compile_, is_postgres),
            OperatorStatements(compile_),
            Shapes(compile_),
        )
    return found


class SqlStoreBase:
    """The state every facet of the SQL store reads, and the path of every operation."""

    # The engine the host made (the default scope; its dispose ends the presence).
    _host_engine: AsyncEngine
    # The engine the schema check runs through: the host's, or a copy in ``_schema``.
    _engine: AsyncEngine
    _schema: str | None
    _executor: Executor
    _is_postgres: bool
    # In a schema, every compiled statement names it (rendered once, by compiled_for).
    _statements: RunStatements
    _shapes: Shapes
    _schema_checked: bool
    # Tokens of the leases this store claimed on the database's clock.
    _database_clock_leases: DatabaseClockLeases

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
        # code run against it (jobrun.sql.upgrades.compat): never claim under rules it lacks.
        from jobrun.sql.upgrades.compat import checked_against

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
