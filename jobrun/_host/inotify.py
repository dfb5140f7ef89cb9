"""Linux inotify through ``ctypes`` (no dependency): which files of some directories
were written, read without blocking from the event loop.

The worker watches the directories holding its SQLite databases: a write to
``name.db`` or its ``-wal`` / ``-journal`` file, by any process, is a reason to
look at that database now (see :mod:`jobrun.worker.wakeups`). Where inotify is not
available (another OS, a libc without it, the per-user watch limit reached)
:func:`open_watch` returns ``None`` and the caller falls back to its timers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger("jobrun.worker")

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
# Not IN_CLOSE_WRITE nor IN_CREATE: SQLite opens its files read-write and creates the
# -wal file for readers too, so those fire for a mere read (our own probes among them).
WRITES = IN_MODIFY | IN_MOVED_TO
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
_READ_BYTES = 64 * 1024


class DirectoryWatch:
    """One inotify instance: directories added, the file names written since the last read."""

    def __init__(self, libc: ctypes.CDLL, descriptor: int) -> None:
        self._libc = libc
        self.fileno = descriptor
        self._directories: dict[int, Path] = {}
        self._watched: dict[Path, int] = {}
        self.overflowed = False

    def add(self, directory: Path) -> bool:
        """Watch ``directory`` (once however often asked); ``False`` when it cannot be."""
        if directory in self._watched:
            return True
        watch = self._libc.inotify_add_watch(self.fileno, os.fsencode(directory), WRITES)
        if watch < 0:
            code = ctypes.get_errno()
            log.warning(
                "cannot watch %s for writes (%s): its databases are looked at by timer only",
                directory,
                os.strerror(code) if code else "unknown error",
            )
            return False
        self._directories[watch] = directory
        self._watched[directory] = watch
        return True

    def read(self) -> set[Path]:
        """The paths written since the last read (empty when nothing is waiting). After
        a queue overflow ``overflowed`` is set: the caller should look at everything."""
        written: set[Path] = set()
        while True:
            try:
                data = os.read(self.fileno, _READ_BYTES)
            except BlockingIOError:
                return written
            except OSError as error:
                if error.errno == errno.EINTR:
                    continue
                raise
            self._parse(data, written)

    def _parse(self, data: bytes, written: set[Path]) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            watch, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            raw_name = data[offset + _HEADER.size : offset + _HEADER.size + length]
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self.overflowed = True
                continue
            directory = self._directories.get(watch)
            name = raw_name.rstrip(b"\0")
            if directory is not None and name:
                written.add(directory / os.fsdecode(name))

    def close(self) -> None:
        os.close(self.fileno)


def open_watch() -> DirectoryWatch | None:
    """A new inotify instance (non-blocking), or ``None`` where there is none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
        init = libc.inotify_init1
    except (OSError, AttributeError):
        return None
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    descriptor = init(IN_NONBLOCK | IN_CLOEXEC)
    if descriptor < 0:
        log.warning("inotify is not available: SQLite databases are looked at by timer only")
        return None
    return DirectoryWatch(libc, descriptor)


def database_of(path: Path) -> Path:
    """The database file a written file belongs to (``x.db-wal`` -> ``x.db``)."""
    name = path.name
    for suffix in ("-wal", "-journal"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)])
    return path
