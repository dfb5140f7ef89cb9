"""Who holds a lease, precisely enough to prove that it died.

A claim writes into ``lease_driver`` the driver's name for operators followed by
this process's identity in brackets (one line, wrapped here)::

    worker-1/3 [jobrun host=web-7 boot=5c1d…e9 pidns=4026531836 timens=4026531834
                       pid=4121 start=8934 presence=77…]

* ``host`` is the node name, for people; it proves nothing (containers on one
  kernel may carry other names, machines may share one).
* ``boot`` (the kernel's boot id), ``pidns`` (the pid namespace's inode) and
  ``timens`` (the time namespace's inode; absent where the kernel has none) say
  which process table ``pid`` indexes and in which clock ``start`` was read.
  ``start`` is the process start time in clock ticks since boot (field 22 of
  ``/proc/<pid>/stat``); a reader in a time namespace sees it shifted by that
  namespace's boot-time offset, so two start times compare only within one time
  namespace.
* ``pid`` and ``start`` are recorded only when this process's ``/proc`` shows
  its own pid namespace (``/proc/self`` is our pid and ``NSpid`` has one entry): a
  process in a pid namespace under the host's ``/proc`` knows its pid but cannot
  read its start time, so it records neither and is never judged by pid.
* ``presence`` (Postgres only) is the key of a session-level advisory lock the
  process holds on a connection of its own; Postgres drops it when the session
  ends, so a claimer on any host that finds the lock free has proof of death.

The check by pid (:func:`liveness_seen_from`) answers dead, alive or unknown. It
judges only a holder with a pid and start time whose boot id, pid namespace and
time namespace all equal the checker's (a time namespace missing on both sides
counts as equal: that kernel has none), and only when the checker's own
``/proc`` passes the test above; every other case is unknown. Dead means the pid
is gone, a zombie, or running with another start time (a reused pid). Unknown
holders are taken over only when their lease expires or their presence ends.
The text is free for operators to read; only the bracket at its very end is
parsed.

Nothing here reads ``/proc`` itself: this process's identity and the look at
another process come from a :class:`Host` handed in (the real one,
``jobrun._host.system.THIS_HOST``, learns the identity once per process).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

_BRACKET = re.compile(r" \[jobrun ([^\[\]]*)\]\Z")
_FIELD = re.compile(r"(?:^|\s)(host|boot|pidns|timens|pid|start|presence)=(\S+)")

PRESENCE_PATTERN = r" \[jobrun (?:[^\[\]]* )?presence=([0-9]+)(?: [^\[\]]*)?\]\Z"
"""The presence key in a stored ``lease_driver`` (its one group), wherever the field
stands in the bracket. The one definition: :func:`parse_holder` reads it with
Python's ``re``, and the SQL store hands the same text to Postgres's ``substring``
(``jobrun.sql.postgres.presence``), whose regular expressions read it alike."""
_PRESENCE = re.compile(PRESENCE_PATTERN)


class Liveness(Enum):
    """What this host can tell about a holder's process."""

    DEAD = "dead"
    ALIVE = "alive"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class HolderIdentity:
    host: str
    boot: str | None = None
    pid_namespace: str | None = None
    pid: int | None = None
    start_ticks: int | None = None
    presence: int | None = None
    time_namespace: str | None = None

    def describe(self, name: str) -> str:
        """``name`` followed by the bracket a claim stores in ``lease_driver``."""
        fields = [f"host={self.host}"]
        for label, value in (
            ("boot", self.boot),
            ("pidns", self.pid_namespace),
            ("timens", self.time_namespace),
            ("pid", self.pid),
            ("start", self.start_ticks),
            ("presence", self.presence),
        ):
            if value is not None:
                fields.append(f"{label}={value}")
        return f"{name} [jobrun {' '.join(fields)}]"

    def same_process_table(self, other: HolderIdentity) -> bool:
        """Whether ``other``'s pid and start time mean what ours would: one kernel boot,
        one pid namespace, one time namespace (or none on either side)."""
        return (
            self.boot is not None
            and self.pid_namespace is not None
            and (self.boot, self.pid_namespace, self.time_namespace)
            == (other.boot, other.pid_namespace, other.time_namespace)
        )

    def knows_its_process(self) -> bool:
        """Whether pid and start time were read through a ``/proc`` of our own."""
        return self.pid is not None and self.start_ticks is not None


def parse_holder(lease_driver: str | None) -> HolderIdentity | None:
    """The identity at the end of a stored ``lease_driver``; ``None`` if it carries none."""
    if not lease_driver:
        return None
    found = _BRACKET.search(lease_driver)
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group(1)))
    presence = _PRESENCE.search(lease_driver)
    if "presence" in fields and presence is None:
        return None  # a malformed field, as below
    try:
        return HolderIdentity(
            host=fields.get("host", "?"),
            boot=fields.get("boot"),
            pid_namespace=fields.get("pidns"),
            time_namespace=fields.get("timens"),
            pid=int(fields["pid"]) if "pid" in fields else None,
            start_ticks=int(fields["start"]) if "start" in fields else None,
            presence=None if presence is None else int(presence.group(1)),
        )
    except ValueError:
        return None


class Host(Protocol):
    """This process's host as the core sees it: who we are, and whether a holder lives."""

    def identity(self) -> HolderIdentity:
        """This process's identity, as a claim records it."""
        ...

    def liveness(self, holder: HolderIdentity) -> Liveness:
        """Whether this host sees ``holder``'s process dead, alive, or cannot tell."""
        ...


def liveness_seen_from(
    here: HolderIdentity,
    holder: HolderIdentity,
    process_exists: Callable[[int], bool],
    stat_fields: Callable[[int], list[str] | None],
) -> Liveness:
    """Whether ``here`` (the checker) sees ``holder``'s process dead, alive, or cannot tell.

    It judges only through a ``/proc`` of its own and only a holder in its own
    process table and clock. ``process_exists(pid)`` and ``stat_fields(pid)``
    (``/proc/<pid>/stat`` from field 3 on) are the host's answers.
    """
    if holder.pid is None or holder.start_ticks is None:
        return Liveness.UNKNOWN
    if not here.knows_its_process() or not here.same_process_table(holder):
        return Liveness.UNKNOWN
    if not process_exists(holder.pid):
        return Liveness.DEAD
    # It exists (perhaps another user's): its start time tells whether it is the holder.
    fields = stat_fields(holder.pid)
    if fields is None or len(fields) <= 19:
        return Liveness.UNKNOWN
    if fields[0] in ("Z", "X"):
        return Liveness.DEAD  # exited, not yet reaped by its parent
    return Liveness.ALIVE if fields[19] == str(holder.start_ticks) else Liveness.DEAD
