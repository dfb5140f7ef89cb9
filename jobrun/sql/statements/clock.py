"""The database's clock in SQL: now, later, and time between two stored instants.

Instants are stored as text (``jobrun._core.model.formats.format_instant``: UTC,
milliseconds, ``Z``); these expressions write and read that text on the
database's own clock, so that a claim, a renewal or a rate limit's refill is
judged there rather than on a caller's clock. Used by the runs facet (a lease
judged and counted on Postgres's clock), the claim, and the limits (buckets
refill on the database's clock on both engines).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    TIMESTAMP,
    Float,
    Text,
    bindparam,
    cast,
    extract,
    func,
    literal_column,
    select,
)
from sqlalchemy.sql import visitors

# The stored instant text (jobrun._core.model.formats.format_instant), as Postgres writes it.
_INSTANT_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'
# The same, as SQLite's strftime writes it.
_SQLITE_INSTANT_FORMAT = "'%Y-%m-%dT%H:%M:%fZ'"


def database_instant(moment: Any) -> Any:
    """Postgres: a ``timestamptz`` expression as stored instant text (UTC, milliseconds)."""
    return func.to_char(
        func.timezone(literal_column("'UTC'"), moment), literal_column(f"'{_INSTANT_FORMAT}'")
    )


def database_now_at() -> Any:
    """Postgres: the database's clock as the statement runs, as stored instant text.
    The statement's start, not the transaction's: a claim waiting on a limit's lock
    judges expiries and counts its lease from after the wait."""
    return database_instant(func.statement_timestamp())


def on_database_clock(statement: Any) -> Any:
    """``statement`` with its ``now_at`` parameter read from the database's clock."""

    def replace(element: Any, **_: Any) -> Any:
        if getattr(element, "key", None) == "now_at" and element.__visit_name__ == "bindparam":
            return database_now_at()
        return None

    options: dict[str, Any] = {}
    return visitors.replacement_traverse(statement, options, replace)


def moved_to_database_clock(instant: str, counted_from: str) -> Any:
    """Postgres: parameter ``instant``, counted on a client's clock from parameter
    ``counted_from``, moved by that clock's distance to the database's right now."""

    def moment(name: str) -> Any:
        return cast(bindparam(name, type_=Text), TIMESTAMP(timezone=True))

    return database_instant(moment(instant) + (func.statement_timestamp() - moment(counted_from)))


def database_now(is_postgres: bool) -> Any:
    """The database's clock now (as it reads while the statement runs), as
    ``jobrun._core.model.formats.format_instant`` writes instants (milliseconds truncated,
    UTC, ``Z``)."""
    if is_postgres:
        return database_instant(func.clock_timestamp())
    return func.strftime(literal_column(_SQLITE_INSTANT_FORMAT), literal_column("'now'"))


def database_later(is_postgres: bool) -> Any:
    """The database's clock ``later_s`` seconds (a bind) from now, as
    :func:`database_now` writes instants."""
    if is_postgres:
        seconds = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("later_s", type_=Float))
        return database_instant(func.clock_timestamp() + seconds)
    modifier = bindparam("later_modifier", type_=Text)
    return func.strftime(literal_column(_SQLITE_INSTANT_FORMAT), literal_column("'now'"), modifier)


def ms_between(is_postgres: bool, earlier: Any, later: Any) -> Any:
    """Milliseconds from instant text ``earlier`` to ``later`` (whole, as both are)."""
    if is_postgres:
        stamp = TIMESTAMP(timezone=True)
        return extract("epoch", cast(later, stamp) - cast(earlier, stamp)) * 1000
    per_day: Any = literal_column("86400000.0")
    return func.round((func.julianday(later) - func.julianday(earlier)) * per_day)


def clock_statement() -> Any:
    """Postgres: the database's clock, read as the statement runs (how far it is from
    this host's: ``clock_offset_s``)."""
    return select(func.clock_timestamp())
