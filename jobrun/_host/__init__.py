"""The host: what jobrun reads from the machine it runs on, kept apart from the rest.

The core is pure (no clock, no pid, no file descriptor): the real sources it is
handed are made here, as are the two pieces that talk to Linux itself. Code
above the core imports them from this face.

* :mod:`~jobrun._host.system`: the system clock, this process's identity (pid,
  boot, namespaces), ids and chance, and how a holder on this host is judged;
* :mod:`~jobrun._host.watchdog`: the thread that ends a process whose step body
  outlives its lease;
* :mod:`~jobrun._host.inotify`: which SQLite files were written (the worker's
  wake-ups).

None of these imports anything of jobrun above the core (import-linter checks it).
"""

from jobrun._host.inotify import DirectoryWatch, database_of, open_watch
from jobrun._host.system import (
    SYSTEM_CLOCK,
    THIS_HOST,
    current_pid,
    default_driver_name,
    host_name,
    liveness_on_this_host,
    local_identity,
    mint_run_id,
    resolve_clock,
    system_clock,
    system_random,
)
from jobrun._host.watchdog import real_time_guard

__all__ = [
    "SYSTEM_CLOCK",
    "THIS_HOST",
    "DirectoryWatch",
    "current_pid",
    "database_of",
    "default_driver_name",
    "host_name",
    "liveness_on_this_host",
    "local_identity",
    "mint_run_id",
    "open_watch",
    "real_time_guard",
    "resolve_clock",
    "system_clock",
    "system_random",
]
