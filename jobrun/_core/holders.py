"""Who holds a lease, precisely enough to prove that it died.

A claim writes into ``lease_driver`` the driver's name for operators followed by
this process's identity in brackets::

    worker-1/3 [jobrun host=web-7 boot=5c1d…e9 pidns=4026531836 pid=4121 start=8934 presence=77…]

* ``host`` is the node name, for people; it proves nothing.
* ``boot`` (the kernel's boot id) and ``pidns`` (the pid namespace's inode) say
  which process table ``pid`` belongs to; ``start`` (the process start time in
  clock ticks since boot, field 22 of ``/proc/<pid>/stat``) tells a reused pid
  apart. A claimer with the same boot id and pid namespace that finds ``pid``
  gone, or running with another start time, or a zombie, has proof of death.
* ``presence`` (Postgres only) is the key of a session-level advisory lock the
  process holds on a connection of its own; Postgres drops it when the session
  ends, so a claimer on any host that finds the lock free has proof of death.

Fields this process cannot learn (no ``/proc``: macOS) are left out and prove
nothing; such a holder is taken over only when its lease expires. The text is
free for operators to read; only the bracket at its very end is parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobrun import _system

_BRACKET = re.compile(r" \[jobrun ([^\[\]]*)\]\Z")
_FIELD = re.compile(r"(host|boot|pidns|pid|start|presence)=(\S+)")


@dataclass(frozen=True, slots=True)
class HolderIdentity:
    host: str
    boot: str | None = None
    pid_namespace: str | None = None
    pid: int | None = None
    start_ticks: int | None = None
    presence: int | None = None

    def describe(self, name: str) -> str:
        """``name`` followed by the bracket a claim stores in ``lease_driver``."""
        fields = [f"host={self.host}"]
        for label, value in (
            ("boot", self.boot),
            ("pidns", self.pid_namespace),
            ("pid", self.pid),
            ("start", self.start_ticks),
            ("presence", self.presence),
        ):
            if value is not None:
                fields.append(f"{label}={value}")
        return f"{name} [jobrun {' '.join(fields)}]"

    def same_process_table(self, other: HolderIdentity) -> bool:
        """Whether ``other``'s pid means the same process table as ours."""
        return (
            self.boot is not None
            and self.pid_namespace is not None
            and (self.boot, self.pid_namespace) == (other.boot, other.pid_namespace)
        )


def parse_holder(lease_driver: str | None) -> HolderIdentity | None:
    """The identity at the end of a stored ``lease_driver``; ``None`` if it carries none."""
    if not lease_driver:
        return None
    found = _BRACKET.search(lease_driver)
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group(1)))
    try:
        return HolderIdentity(
            host=fields.get("host", "?"),
            boot=fields.get("boot"),
            pid_namespace=fields.get("pidns"),
            pid=int(fields["pid"]) if "pid" in fields else None,
            start_ticks=int(fields["start"]) if "start" in fields else None,
            presence=int(fields["presence"]) if "presence" in fields else None,
        )
    except ValueError:
        return None


_local: tuple[int, HolderIdentity] | None = None


def local_identity() -> HolderIdentity:
    """This process's identity (learnt once per pid, so a forked child learns its own)."""
    global _local
    pid = _system.current_pid()
    if _local is None or _local[0] != pid:
        fields = _system.stat_fields("self")
        start = fields[19] if fields is not None and len(fields) > 19 else None
        _local = (
            pid,
            HolderIdentity(
                host=_system.host_name(),
                boot=_system.read_text("/proc/sys/kernel/random/boot_id"),
                pid_namespace=_system.pid_namespace(),
                pid=pid,
                start_ticks=int(start) if start is not None and start.isdigit() else None,
            ),
        )
    return _local[1]


def died_on_this_host(holder: HolderIdentity, here: HolderIdentity | None = None) -> bool:
    """Whether this host can prove that ``holder``'s process is gone.

    ``False`` means "not proven", never "alive for sure": a holder on another
    host, or one whose process this one may not inspect, is not proven dead.
    """
    here = local_identity() if here is None else here
    if holder.pid is None or holder.start_ticks is None or not here.same_process_table(holder):
        return False
    if not _system.process_exists(holder.pid):
        return True
    # It exists (perhaps another user's): its start time tells whether it is the holder.
    fields = _system.stat_fields(holder.pid)
    if fields is None or len(fields) <= 19:
        return False
    if fields[0] in ("Z", "X"):
        return True  # exited, not yet reaped by its parent
    return fields[19] != str(holder.start_ticks)
