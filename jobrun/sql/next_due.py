"""When a database's next run comes due, and who holds its leases, read without a
pool connection; on SQLite, the worker's own row written the same way.

An idle worker sleeps until then (or until woken): see :mod:`jobrun.worker.wakeups`;
while another process holds a lease there it also looks, as often as
``jobrun._core.leases.proof_of_death.IDLE_LOOK_S``, whether the holder died
(:func:`sqlite_held_leases`; Postgres: ``SqlJobRunStore.held_leases_on_presence``).
SQLite: a short-lived stdlib ``sqlite3`` connection, opened, read and closed in
the calling thread (a read of a small local index, well under a millisecond,
and no aiosqlite thread kept for an idle database). Postgres: on the store's
presence connection, which stays open anyway for ``LISTEN``.

The worker's registration (``jobrun.worker.registration``) writes its row in a
SQLite file through a stdlib connection too, in a thread of the loop's pool: an
engine opened for it was an aiosqlite thread started, the schema checked and,
over more files than ``--max-open-sqlite``, another engine closed, some 20 ms
of CPU a write, where this costs about half a millisecond.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite as sqlite_dialect

from jobrun._core import BootInstant, HeldLease, WorkerRow
from jobrun.sql.executor import Compiler, Prepared
from jobrun.sql.statements.operator import (
    beat_worker_statement,
    beat_worker_values,
    forget_worker_statement,
    sweep_workers_statement,
)
from jobrun.sql.statements.runs import held_leases_statement
from jobrun.sql.statements.worker import next_due_statement
from jobrun.sql.store import SqlJobRunStore
from jobrun.sql.store.base import pairs as job_pairs

# No wait at all: the read runs on the event loop's thread, and a file that is busy
# (its WAL being recovered, or checkpointed by a connection closing) made every
# database of the worker wait up to this long; busy, the read fails at once
# (FileBusy) and the caller reads again a moment later.
_SQLITE_TIMEOUT_S = 0.0


BUSY_LOOK_AGAIN_S = 0.05
"""How soon to read a busy file again: a checkpoint or a recovery takes moments."""


class FileBusy(sqlite3.OperationalError):
    """The SQLite file was busy for the read (it does not wait: see ``_SQLITE_TIMEOUT_S``)."""


@functools.cache
def _sqlite_statement(booted: bool = False) -> Prepared:
    return Compiler(sqlite_dialect.dialect(paramstyle="qmark"))(next_due_statement(booted))


@functools.cache
def _sqlite_held_leases(jobs: int) -> Prepared:
    return Compiler(sqlite_dialect.dialect(paramstyle="qmark"))(
        held_leases_statement(jobs, with_presence=False)
    )


_WRITE_TIMEOUT_S = 5.0
"""How long a registration write (in a thread, never on the loop's) waits for a busy file."""


@functools.cache
def _sqlite_worker_statements() -> tuple[Prepared, Prepared, Prepared]:
    compiled = Compiler(sqlite_dialect.dialect(paramstyle="qmark"))
    return (
        compiled(beat_worker_statement(is_postgres=False)),
        compiled(sweep_workers_statement()),
        compiled(forget_worker_statement()),
    )


def sqlite_beat_worker(path: Path, row: WorkerRow, sweep_at: str | None) -> None:
    """``beat_worker`` on the SQLite file ``path``, committed (blocking: call it from a
    thread): the worker's row written, and with ``sweep_at`` gone workers' rows deleted."""
    beat, sweep, _forget = _sqlite_worker_statements()
    writes: list[tuple[Prepared, Mapping[str, Any]]] = [(beat, beat_worker_values(row))]
    if sweep_at is not None:
        writes.append((sweep, {"now_at": sweep_at}))
    _sqlite_write(path, writes)


def sqlite_forget_worker(path: Path, worker_id: str) -> None:
    """``forget_worker`` on the SQLite file ``path`` (blocking, as ``sqlite_beat_worker``)."""
    _sqlite_write(path, [(_sqlite_worker_statements()[2], {"worker_id": worker_id})])


def _sqlite_write(path: Path, writes: list[tuple[Prepared, Mapping[str, Any]]]) -> None:
    connection = _sqlite_connect(path, _WRITE_TIMEOUT_S)
    try:
        with connection:  # one transaction, committed on the way out
            for prepared, values in writes:
                connection.execute(prepared.sql, prepared.arguments(values))
    finally:
        connection.close()


def _sqlite_connect(path: Path, timeout_s: float) -> sqlite3.Connection:
    # mode=rw: a file that went away is an error here, not a new empty database.
    address = f"{path.resolve().as_uri()}?mode=rw"
    return sqlite3.connect(address, timeout=timeout_s, uri=True)


def _sqlite_read(path: Path, prepared: Prepared, values: Mapping[str, Any]) -> list[Any]:
    connection = _sqlite_connect(path, _SQLITE_TIMEOUT_S)
    try:
        return connection.execute(prepared.sql, prepared.arguments(values)).fetchall()
    except sqlite3.OperationalError as error:
        if error.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise FileBusy(str(error)) from error
        raise
    finally:
        connection.close()


def sqlite_next_due_at(path: Path) -> str | None:
    """The earliest due instant of the live runs in the SQLite file ``path`` (``None``:
    no live run). Raises :class:`FileBusy` when the file is busy at that moment, and
    ``sqlite3.Error`` when it cannot be read (no schema yet)."""
    rows = _sqlite_read(path, _sqlite_statement(), {})
    return None if not rows or rows[0][0] is None else str(rows[0][0])


def sqlite_next_due(path: Path, boot: BootInstant | None) -> tuple[str | None, int | None]:
    """The same, with the runs held on ``boot``'s clock apart: (the earliest due
    instant of the others, the earliest boot-clock expiry of those); one read."""
    if boot is None:
        return sqlite_next_due_at(path), None
    values = {"boot_id": boot.boot_id, "boot_ms": boot.ms}
    rows = _sqlite_read(path, _sqlite_statement(True), values)
    if not rows:
        return None, None
    due_at, held_ms = rows[0]
    return (None if due_at is None else str(due_at)), (None if held_ms is None else int(held_ms))


def sqlite_held_leases(
    path: Path, now_at: str, jobs: frozenset[tuple[str, str]]
) -> list[HeldLease]:
    """``held_leases`` of ``jobs`` at ``now_at`` in the SQLite file ``path``, read the
    way the next due instant is (a stdlib connection, opened and closed here)."""
    if not jobs:
        return []
    values = {"now_at": now_at} | job_pairs("", sorted(jobs))
    return [HeldLease(*row) for row in _sqlite_read(path, _sqlite_held_leases(len(jobs)), values)]


async def postgres_next_due_at(store: SqlJobRunStore) -> str | None:
    """The same on Postgres, on the store's presence connection (no pool connection)."""
    schema_map: Mapping[str | None, str] | None = None
    if store.schema is not None:
        schema_map = {None: store.schema}
    prepared = Compiler(store.engine.dialect, schema_map)(next_due_statement())
    arguments = prepared.arguments({})

    async def read(raw: Any) -> Any:
        return await raw.fetchval(prepared.sql, *arguments)

    found = await store.on_presence_connection(read)
    return None if found is None else str(found)
