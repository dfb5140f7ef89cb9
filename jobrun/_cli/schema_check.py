"""What ``jobrun db current`` and ``jobrun db check`` read: revisions and drift.

Drift is either a revision that is not the head this jobrun ships, or a
difference Alembic's autogenerate comparison finds between jobrun's tables in
the database and :data:`jobrun.sql.schema.metadata`. Only jobrun's own tables
are compared: a host's tables in the same database are none of jobrun's business.
Alembic compares columns, types, server defaults and indexes by name, uniqueness
and columns; an index on an expression cannot be compared on SQLite, and the
WHERE clause of a partial index is never compared.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._cli.privileges import missing_privileges
from jobrun.sql.postgres.tenancy import checked_schema, version_options
from jobrun.sql.schema import metadata
from jobrun.sql.upgrades.migrate import _alembic_turn, current_revision, head_revision


@dataclass(frozen=True, slots=True)
class SchemaState:
    current: str | None
    head: str | None
    differences: list[str] = field(default_factory=list)
    missing_privileges: list[str] = field(default_factory=list)

    @property
    def at_head(self) -> bool:
        return self.current is not None and self.current == self.head

    @property
    def drifted(self) -> bool:
        return not self.at_head or bool(self.differences) or bool(self.missing_privileges)


async def revisions(engine: AsyncEngine, schema: str | None = None) -> SchemaState:
    checked_schema(engine, schema)
    async with engine.connect() as connection:
        current = await connection.run_sync(current_revision, schema)
    return SchemaState(current=current, head=head_revision())


def _jobrun_tables_only(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    return type_ != "table" or name in metadata.tables


def describe_difference(difference: Any) -> str:
    """One line per Alembic diff entry (a tuple, or a list of tuples for column changes)."""
    if isinstance(difference, list):
        return "; ".join(describe_difference(part) for part in difference)
    kind, *details = difference
    parts: list[str] = []
    for detail in details:
        name = getattr(detail, "name", None)
        table = getattr(getattr(detail, "table", None), "name", None)
        if name is not None:
            parts.append(f"{table}.{name}" if table and table != name else str(name))
        elif isinstance(detail, dict | type(None)):
            continue
        else:
            parts.append(str(detail))
    return f"{kind}: {', '.join(parts)}" if parts else str(kind)


def _compare(connection: Connection, schema: str | None) -> list[str]:
    # Imported here: `jobrun db check` needs Alembic, the other commands do not.
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(
        connection,
        opts={
            **version_options(schema),
            "include_object": _jobrun_tables_only,
            "compare_type": True,
            "compare_server_default": True,
        },
    )
    with warnings.catch_warnings():
        # SQLite cannot reflect an index on an expression, so Alembic skips it and
        # says so; that is a limit of the comparison, not drift.
        warnings.filterwarnings("ignore", message=r".*expression-based index")
        found = compare_metadata(context, metadata)
    return [describe_difference(entry) for entry in found]


async def check(engine: AsyncEngine, schema: str | None = None) -> SchemaState:
    """The privileges the connecting role lacks (Postgres), else the revisions, and
    when the database is at head, the tables' differences."""
    missing = await missing_privileges(engine, checked_schema(engine, schema))
    if missing:
        # Reading the revision may be what is not allowed: report the grants first.
        return SchemaState(None, head_revision(), missing_privileges=missing)
    state = await revisions(engine, schema)
    if not state.at_head:
        return state
    # One comparison at a time in the process: the warnings filter below is global.
    async with _alembic_turn(), engine.begin() as connection:
        if schema is not None:
            # Reflection without a schema looks where search_path points.
            await connection.exec_driver_sql(f'SET LOCAL search_path TO "{schema}"')
        differences = await connection.run_sync(_compare, schema)
    return SchemaState(state.current, state.head, differences)
