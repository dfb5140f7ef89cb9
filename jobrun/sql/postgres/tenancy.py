"""Tenants in Postgres schemas: which schema names jobrun takes, and where it looks.

With ``schema="tenant_a"`` jobrun's two tables and its version table live in
that schema. Migrations run with ``search_path`` set to the schema for their
transaction (Alembic's column and index operations do not qualify table names,
so a translate map would send half the DDL elsewhere); the store's statements
carry the schema through SQLAlchemy's ``schema_translate_map`` on a copy of the
engine that only the store uses, so the host's own engine stays as it was.

A host engine that already has a ``schema_translate_map`` is refused before
anything is read or written: Alembic would apply it to some statements and not
others. Schema names are lower-case identifiers of at most 48 characters, so
that they need no quoting and fit in the wake-up channel's name (Postgres
allows 63 bytes for ``jobrun_started.<schema>``).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobrun._core import refuse
from jobrun.sql.schema import VERSION_TABLE

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
NOTIFY_CHANNEL = "jobrun_started"
"""Postgres: the channel new runs are announced on (with ``.<schema>`` for a tenant)."""


def checked_schema(engine: AsyncEngine | Connection, schema: str | None) -> str | None:
    """``schema`` if jobrun can use it on ``engine``; raises JobValidationError otherwise."""
    if engine.get_execution_options().get("schema_translate_map"):
        raise refuse(
            "schema",
            "the engine has a schema_translate_map",
            message="the engine has a schema_translate_map, which jobrun cannot apply to its "
            "migrations; use a plain engine and pass schema=... to jobrun.upgrade and "
            "SqlJobRunStore instead",
        )
    if schema is None:
        return None
    if not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None:
        raise refuse(
            "schema",
            "is not a usable schema name",
            message=f"schema {schema!r} is not usable: use lower-case letters, digits and "
            "underscores, not starting with a digit, at most 48 characters",
        )
    if engine.dialect.name != "postgresql":
        raise refuse(
            "schema",
            f"needs Postgres, not {engine.dialect.name}",
            message=f"schema={schema!r} needs Postgres; on {engine.dialect.name} use one "
            "database per tenant instead",
        )
    return schema


def in_schema(engine: AsyncEngine, schema: str | None) -> AsyncEngine:
    """The engine the store sends its statements through: ``engine`` itself, or a
    copy that puts jobrun's tables in ``schema``."""
    if schema is None:
        return engine
    return engine.execution_options(schema_translate_map={None: schema})


def notify_channel(schema: str | None) -> str:
    """Postgres: the channel one tenant's new runs are announced on, so that a start
    wakes that tenant's workers only."""
    return NOTIFY_CHANNEL if schema is None else f"{NOTIFY_CHANNEL}.{schema}"


async def enter_schema(connection: AsyncConnection, schema: str) -> None:
    """Create ``schema`` if missing and make it the only one the transaction sees."""
    exists = await connection.execute(
        text("SELECT 1 FROM pg_namespace WHERE nspname = :name"), {"name": schema}
    )
    if exists.first() is None:
        # Only when missing: CREATE SCHEMA IF NOT EXISTS still needs CREATE on the database.
        await connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    await connection.exec_driver_sql(f'SET LOCAL search_path TO "{schema}"')


def version_options(schema: str | None) -> dict[str, Any]:
    """The Alembic options that name jobrun's version table (in ``schema`` if given)."""
    return {"version_table": VERSION_TABLE, "version_table_schema": schema}
