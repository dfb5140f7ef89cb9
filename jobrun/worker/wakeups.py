"""How one worker serves many databases: what wakes an idle one, and how many are open.

An idle database costs nothing here until something wakes it:

* a write to a SQLite file (or its ``-wal`` / ``-journal``) by any process, seen
  by inotify on the files' directories (:class:`WriteWatch`);
* on Postgres, ``NOTIFY jobrun_started`` on the presence connection (see
  ``jobrun.worker``);
* a timer at the database's next due instant (:mod:`jobrun.sql.next_due`: the
  earliest retry, or the end of a lease another driver holds), read each time
  the database falls idle; asyncio's own timer heap holds them;
* a slow sweep, every ``SWEEP_S`` at most, in case a wake-up was missed.

A woken database is first read for its next due instant (a probe; SQLite: a
stdlib ``sqlite3`` read, no thread kept) and driven only when something is due.

:class:`OpenStores` bounds the SQLite databases open at once (an engine, its
aiosqlite thread and three file descriptors each): a database is opened when it
is driven and stays open, least recently used first out, until another needs
its place.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun._host import DirectoryWatch, database_of, open_watch

log = logging.getLogger("jobrun.worker")

DEFAULT_MAX_OPEN_SQLITE = 64
"""SQLite databases a worker keeps open at once (``--max-open-sqlite``)."""
SWEEP_S = 60.0
"""An idle watched database is read again at least this often (a missed wake-up)."""


class OpenStores:
    """At most ``limit`` SQLite engines open; an idle one is closed (disposed) when
    another needs its place, least recently used first. Only the engines handed to
    :meth:`manage` (the worker's own, made from file URLs) count: an engine its
    host made is never disposed of here."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Engines in the order they were last used (first: the least recent).
        self._open: collections.OrderedDict[AsyncEngine, int] = collections.OrderedDict()
        self._changed = asyncio.Event()
        self._admitting = asyncio.Lock()
        self._managed: weakref.WeakSet[AsyncEngine] = weakref.WeakSet()
        self.opened = 0
        self.closed = 0

    @property
    def open_count(self) -> int:
        return len(self._open)

    def manage(self, engine: AsyncEngine) -> None:
        self._managed.add(engine)

    @contextlib.asynccontextmanager
    async def use(self, engine: AsyncEngine) -> AsyncIterator[None]:
        """Hold ``engine`` open while the block runs (waiting for room if need be)."""
        if engine not in self._managed:
            yield
            return
        if engine not in self._open:
            await self._admit(engine)
        self._open[engine] += 1
        self._open.move_to_end(engine)
        try:
            yield
        finally:
            if engine in self._open:
                self._open[engine] -= 1
            self._changed.set()

    async def _admit(self, engine: AsyncEngine) -> None:
        async with self._admitting:
            while engine not in self._open and len(self._open) >= self.limit:
                idle = next((each for each, users in self._open.items() if users == 0), None)
                if idle is None:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                del self._open[idle]
                self.closed += 1
                await idle.dispose()
            if engine not in self._open:
                self._open[engine] = 0
                self.opened += 1

    async def forget(self, engine: AsyncEngine) -> None:
        """``engine``'s database is no longer served: close it now."""
        if self._open.pop(engine, None) is not None:
            self.closed += 1
            await engine.dispose()
            self._changed.set()


class WriteWatch:
    """inotify on the directories of the SQLite files: calls ``woken(path)`` for each
    database file written (by anyone); ``everything()`` after a lost event queue."""

    def __init__(self, woken: Callable[[Path], None], everything: Callable[[], None]) -> None:
        self._woken = woken
        self._everything = everything
        self._watch: DirectoryWatch | None = open_watch()
        self._reading = False

    @property
    def available(self) -> bool:
        return self._watch is not None

    def add(self, path: Path) -> bool:
        """Watch the directory of ``path``; ``False`` when writes there will not be seen."""
        if self._watch is None:
            return False
        if not self._reading:
            asyncio.get_running_loop().add_reader(self._watch.fileno, self._read)
            self._reading = True
        return self._watch.add(path.parent)

    def _read(self) -> None:
        assert self._watch is not None
        try:
            written = self._watch.read()
        except OSError as error:
            log.warning("reading inotify events failed: %s; looking at every database", error)
            self._everything()
            return
        if self._watch.overflowed:
            self._watch.overflowed = False
            self._everything()
        for path in written:
            self._woken(database_of(path))

    def close(self) -> None:
        if self._watch is not None:
            if self._reading:
                asyncio.get_running_loop().remove_reader(self._watch.fileno)
            self._watch.close()
            self._watch = None


def sqlite_path(engine: AsyncEngine) -> Path | None:
    """The file of a SQLite engine (``None``: not SQLite, or in memory)."""
    if engine.dialect.name != "sqlite":
        return None
    database: Any = engine.url.database
    if not database or database == ":memory:" or "mode=memory" in str(engine.url):
        return None
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database).resolve()
