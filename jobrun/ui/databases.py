"""The databases a console shows: a name for people, a store to read and act through."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._core import BrowsableStore, refuse, refuse_type, type_name
from jobrun.errors import JobRunError
from jobrun.sql.store import SqlJobRunStore
from jobrun.sql.upgrades.migrate import current_revision, head_revision

DatabaseSource: TypeAlias = BrowsableStore | AsyncEngine
Databases: TypeAlias = Mapping[str, DatabaseSource] | Sequence[DatabaseSource]

# What a database that is down or broken raises through the store or its engine.
DATABASE_FAILURES = (JobRunError, SQLAlchemyError, OSError)


@dataclass(frozen=True, slots=True)
class Database:
    name: str
    store: BrowsableStore
    engine: AsyncEngine | None
    schema: str | None = None  # Postgres: the tenant's schema of a SqlJobRunStore


@dataclass(frozen=True, slots=True)
class Revisions:
    current: str | None
    head: str | None


def _name_of(source: DatabaseSource) -> str:
    engine = source if isinstance(source, AsyncEngine) else getattr(source, "engine", None)
    if isinstance(engine, AsyncEngine):
        url = engine.url
        name = f"{url.get_backend_name()} {url.database or ''}".strip()
        schema = getattr(source, "schema", None)
        return name if schema is None else f"{name} schema {schema}"
    return type(source).__name__


def databases_of(given: Databases) -> list[Database]:
    """Check and name what ``create_app`` was given: stores or engines, by name or in a list."""
    if isinstance(given, Mapping):
        pairs = [(str(name), source) for name, source in given.items()]
    elif isinstance(given, Sequence) and not isinstance(given, str | bytes):
        pairs = [(_name_of(source), source) for source in given]
    else:
        raise refuse_type(
            "databases",
            "must be a mapping of name to store or engine, or a list of them, "
            f"got {type_name(given)}",
        )
    if not pairs:
        raise refuse("databases", "names none", message="the console needs at least one database")
    found: list[Database] = []
    seen: dict[str, int] = {}
    for name, source in pairs:
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name} ({seen[name]})"
        if isinstance(source, AsyncEngine):
            found.append(Database(label, SqlJobRunStore(source), source))
            continue
        if not all(hasattr(source, each) for each in ("find", "count", "job_loads", "cancel")):
            raise refuse_type(
                f"databases.{name}",
                f"is a {type_name(source)}",
                message=f"database {name!r} is a {type_name(source)}: give an AsyncEngine, "
                "a SqlJobRunStore or a MemoryJobRunStore",
            )
        engine = getattr(source, "engine", None)
        engine = engine if isinstance(engine, AsyncEngine) else None
        schema = getattr(source, "schema", None)
        found.append(Database(label, source, engine, schema if isinstance(schema, str) else None))
    return found


async def revisions_of(database: Database) -> Revisions | None:
    """The schema revision the database is at and the head this jobrun ships;
    ``None`` for a store that is not a database."""
    if database.engine is None:
        return None
    async with database.engine.connect() as connection:
        current = await connection.run_sync(current_revision, database.schema)
    return Revisions(current, head_revision())


def upgrade_command(database: Database) -> str:
    """The command that migrates ``database`` (its password hidden), for a page to show."""
    if database.engine is None:
        return "jobrun db upgrade --url URL"
    url = database.engine.url.render_as_string(hide_password=True)
    schema = f" --schema {database.schema}" if database.schema else ""
    return f"jobrun db upgrade --url {shlex.quote(url)}{schema}"
