"""SQLite connection set-up: WAL, a busy timeout and ``synchronous=NORMAL`` on every
connection jobrun uses (the engine's own pool keeps the connections)."""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

_configured: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()

# Tries at switching a file to WAL while other connections keep taking its write lock.
_WAL_ATTEMPTS = 10


def configure_sqlite(engine: AsyncEngine, busy_timeout_ms: int) -> None:
    """Set WAL and a busy timeout on every connection jobrun uses, once each.

    A checkout hook (not only a connect hook) so that connections the host's pool
    opened before the store existed are configured too; the flag in the record's
    ``info`` makes every later checkout free.
    """
    sync_engine = engine.sync_engine
    if sync_engine in _configured:
        _configured[sync_engine] = busy_timeout_ms
        return
    _configured[sync_engine] = busy_timeout_ms
    in_memory = engine.url.database in (None, "", ":memory:") or "mode=memory" in str(engine.url)

    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get("jobrun_configured"):
            return
        cursor = dbapi_connection.cursor()
        try:
            # Concurrent writers (other processes too) wait instead of failing.
            cursor.execute(f"PRAGMA busy_timeout = {int(_configured[sync_engine])}")
            if not in_memory:
                # WAL lets readers run beside the writer; NORMAL sync in WAL is safe
                # against a process crash (the case jobrun exists for) and skips an
                # fsync per commit.
                _switch_to_wal(cursor)
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()
        record.info["jobrun_configured"] = True

    event.listen(sync_engine, "checkout", on_checkout)


def _switch_to_wal(cursor: Any) -> None:
    """Put the file in WAL mode (a property of the file: once done, it stays).

    The switch reads the file, then takes its write lock; SQLite refuses that
    upgrade at once, without waiting out the busy timeout, when another
    connection holds the write lock (a writer, or a connection switching the same
    file). So on "locked" this connection waits its turn for the write lock (a
    ``BEGIN IMMEDIATE`` honours the busy timeout), lets it go and tries again. A
    file still not switched after that works all the same, only with less
    concurrency; the next connection set up tries again.
    """
    for _ in range(_WAL_ATTEMPTS):
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            mode = cursor.fetchone()
        except Exception as error:
            # A read-only file cannot switch journal mode; reading it still works.
            if "readonly" in str(error):
                return
            if "locked" not in str(error):
                raise
            cursor.execute("BEGIN IMMEDIATE")
            cursor.execute("ROLLBACK")
            continue
        if mode is not None and str(mode[0]).lower() == "wal":
            return
