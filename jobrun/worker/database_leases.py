"""Several workers over one set of databases, each database served by one of them.

With ``max_databases`` (``jobrun worker --max-databases N``) a worker serves a
database only while it holds that database's *serving lease*, and at most N of
them at once; the others it tries again every ``RETRY_S``. The lease is one the
operating system or the database ends with the holder, so a database whose
worker died is taken by another (one with room under its cap) within ``RETRY_S``:

* SQLite: an exclusive ``flock`` on a sidecar file ``<database>.jobrun-worker``
  (the kernel releases it when the process dies, however it dies);
* Postgres: a session advisory lock (two-key form, keys ``SERVING_LOCK``) taken
  on the store's presence session, which ends with the process. A presence
  that is lost and opened again takes the lock again (checked every
  ``CHECK_S``); if another worker got it meanwhile, this one stops serving the
  database (its passes in flight finish).

The serving lease only spreads the work: the run leases keep it correct, so two
workers briefly serving one database do nothing wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from jobrun._core import refuse
from jobrun.sql.executor import Compiler
from jobrun.sql.statements.worker import release_database_statement, take_database_statement
from jobrun.sql.store import SqlJobRunStore

RETRY_S = 5.0
"""How often a worker with room tries the databases nobody it knows of serves."""
CHECK_S = 2.0
"""Postgres: how often a served database's presence session is checked for the lock."""
# The two keys of the Postgres serving lock: "jobrun" and "serving" in ASCII, truncated.
SERVING_LOCK = (0x6A6F6272, 0x73657276)
SIDECAR_SUFFIX = ".jobrun-worker"


class SqliteServingLease:
    """The ``flock`` on a SQLite database's sidecar file, held while it is served."""

    def __init__(self, database: Path) -> None:
        self.sidecar = database.with_name(database.name + SIDECAR_SUFFIX)
        self._descriptor: int | None = None

    async def try_take(self) -> bool:
        descriptor = os.open(self.sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor
        return True

    async def release(self) -> None:
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(descriptor)  # closing the last descriptor releases the lock


class PostgresServingLease:
    """The advisory lock on the store's presence session, held while it is served."""

    def __init__(self, store: SqlJobRunStore) -> None:
        self._store = store
        self._held_on: Any = None

    async def try_take(self) -> bool:
        """Take the lock (again, on a new presence session); ``True`` if held now."""
        raw = await self._store.presence_connection()
        if raw is self._held_on and not raw.is_closed():
            return True
        taken = bool(await self._send(take_database_statement()))
        self._held_on = raw if taken else None
        return taken

    async def release(self) -> None:
        held_on, self._held_on = self._held_on, None
        if held_on is not None and not held_on.is_closed():
            with contextlib.suppress(Exception):
                await self._send(release_database_statement())

    async def _send(self, statement: Any) -> Any:
        prepared = Compiler(self._store.engine.dialect)(statement)
        values = {"lease_class": SERVING_LOCK[0], "lease_key": SERVING_LOCK[1]}

        async def send(connection: Any) -> Any:
            return await connection.fetchval(prepared.sql, *prepared.arguments(values))

        return await self._store.on_presence_connection(send)


ServingLease = SqliteServingLease | PostgresServingLease


def serving_lease(store: SqlJobRunStore, path: Path | None) -> ServingLease:
    """The serving lease of a database: its file's (SQLite), its presence's (Postgres)."""
    if path is not None:
        return SqliteServingLease(path)
    if store.engine.dialect.name != "postgresql":
        raise refuse(
            "max_databases",
            f"needs SQLite files or Postgres databases, not {store.engine.dialect.name} "
            "in memory or elsewhere: a serving lease lives in one or the other",
        )
    return PostgresServingLease(store)
