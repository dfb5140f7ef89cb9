"""Which jobrun code may run against a database: the compatibility record.

Revision 0006 created a one-row table (:data:`jobrun.sql.schema.COMPAT_TABLE`)
holding the oldest jobrun code revision that may still run against the
database; each later revision leaves it as it is (code older than itself is
safe) or raises it (it is not). A store's first operation checks it when the
database is newer than its code (:func:`refusal`): code older than the record
refuses to run with :class:`~jobrun.errors.CodeOutdatedError`, before it can
claim a run or write anything. Code from before 0006 has no such check: it must
be stopped before the migration (docs/how-to/upgrade.md).
"""

from __future__ import annotations

from sqlalchemy import column, inspect, select, table
from sqlalchemy.engine import Connection

from jobrun.errors import CodeOutdatedError, JobRunError, SchemaOutdatedError
from jobrun.sql.schema import COMPAT_TABLE
from jobrun.sql.upgrades.migrate import current_revision


def oldest_code_revision(connection: Connection, schema: str | None = None) -> str | None:
    """The oldest code revision the database accepts; ``None`` when it has no record
    (a database from before revision 0006)."""
    if not inspect(connection).has_table(COMPAT_TABLE, schema=schema):
        return None
    record = table(COMPAT_TABLE, column("oldest_code_revision"), schema=schema)
    found = list(connection.execute(select(record.c.oldest_code_revision)).scalars())
    # Several rows (written by hand) would be ambiguous: the strictest one counts.
    return max(found) if found else None


def checked_against(
    connection: Connection, schema: str | None, code_revision: str
) -> JobRunError | None:
    """Why code of ``code_revision`` may not run against the database, or ``None``:
    one read of the revision, and of the record only when the database is newer."""
    found = current_revision(connection, schema)
    oldest = None
    if found is not None and found > code_revision:
        oldest = oldest_code_revision(connection, schema)
    return refusal(found, oldest, code_revision)


def refusal(found: str | None, oldest: str | None, code_revision: str) -> JobRunError | None:
    """Why code of ``code_revision`` may not run against a database at revision
    ``found`` whose record says ``oldest``; ``None`` when it may.

    Revision ids are zero-padded numbers, so text order is revision order.
    """
    if found is None or found < code_revision:
        return SchemaOutdatedError(found, code_revision)
    if found > code_revision and oldest is not None and code_revision < oldest:
        return CodeOutdatedError(found, oldest, code_revision)
    return None
