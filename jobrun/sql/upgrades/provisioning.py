"""Many scope databases at once: one database per tenant, upgraded in one go.

Each database gets an engine of its own, made here and disposed of when its
work is done; at most ``concurrency`` databases are open at a time. A database
that fails (unreachable, refused, a migration error) is recorded as failed and
the others go on: one broken tenant must not hold back the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from jobrun._core import is_int, refuse
from jobrun.sql.upgrades.migrate import current_revision, upgrade
from jobrun.sql.urls import with_asyncio_driver

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class DatabaseOutcome(Generic[T]):
    """What one database gave: a value, or the first line of its error."""

    url: str
    """The database's URL with its password hidden."""
    value: T | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True, slots=True)
class UpgradeResult:
    """One database's upgrade: the revision before and after, or why it failed."""

    url: str
    """The database's URL with its password hidden."""
    before: str | None
    after: str | None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether this database's upgrade failed (``error`` says why)."""
        return self.error is not None

    @property
    def changed(self) -> bool:
        """Whether the upgrade moved this database to another revision."""
        return self.error is None and self.before != self.after


def engine_for(url: str | URL) -> AsyncEngine:
    """An engine on jobrun's asyncio driver, with a bounded connect time on Postgres."""
    parsed = with_asyncio_driver(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql" and "timeout" not in parsed.query:
        connect_args["timeout"] = CONNECT_TIMEOUT_S
    return create_async_engine(parsed, connect_args=connect_args)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _shown(url: str | URL) -> str:
    try:
        return with_asyncio_driver(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable URL>"


async def on_each_database(
    urls: Iterable[str | URL],
    act: Callable[[AsyncEngine], Awaitable[T]],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[DatabaseOutcome[T]]:
    """``act`` on each database, at most ``concurrency`` at a time; outcomes in input order."""
    if not is_int(concurrency) or concurrency < 1:
        problem = f"must be a whole number of at least 1, got {concurrency!r}"
        raise refuse("concurrency", problem, message=f"concurrency {problem}")
    gate = asyncio.Semaphore(concurrency)

    async def one(url: str | URL) -> DatabaseOutcome[T]:
        async with gate:
            try:
                engine = engine_for(url)
            except Exception as error:
                return DatabaseOutcome(_shown(url), error=_first_line(error))
            try:
                return DatabaseOutcome(_shown(url), value=await act(engine))
            except Exception as error:
                return DatabaseOutcome(_shown(url), error=_first_line(error))
            finally:
                await engine.dispose()

    return list(await asyncio.gather(*(one(url) for url in urls)))


async def revision_of(engine: AsyncEngine, schema: str | None = None) -> str | None:
    """jobrun's revision in the database (``None`` before the first upgrade)."""
    async with engine.connect() as connection:
        return await connection.run_sync(current_revision, schema)


async def upgrade_many(
    urls: Iterable[str | URL],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    schema: str | None = None,
    revision: str = "head",
) -> list[UpgradeResult]:
    """Upgrade jobrun's tables in every database of ``urls``, ``concurrency`` at a time.

    Never raises for one database's failure: each result says what happened, in
    the order of ``urls``. ``sqlite://`` and ``postgresql://`` URLs get jobrun's
    asyncio drivers; a SQLite file is created if missing.
    """

    async def act(engine: AsyncEngine) -> tuple[str | None, str | None]:
        before = await revision_of(engine, schema)
        await upgrade(engine, revision, schema=schema)
        return before, await revision_of(engine, schema)

    outcomes = await on_each_database(urls, act, concurrency=concurrency)
    return [
        UpgradeResult(outcome.url, *outcome.value)
        if outcome.value is not None
        else UpgradeResult(outcome.url, None, None, outcome.error)
        for outcome in outcomes
    ]
