"""The real sources the core is handed: the system clock, this process's name, ids and chance.

``jobrun._core`` imports no ``time``, ``os``, ``socket`` or ``random``, directly
or through another module (import-linter checks it), and does not import this
module either: everything it needs from the machine is made here and handed to
it by the public entry points (``jobrun._api``), and each piece can be
replaced by an argument (``clock=``, ``random=``, ``driver_name=``) so tests can
make it deterministic.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

from jobrun._core.leases.holders import HolderIdentity, Liveness, liveness_seen_from
from jobrun._core.model.ids import UlidMint
from jobrun._core.model.records import BootInstant
from jobrun._core.time.clock import Clock, ClockLike, Deadline, as_clock

# Linux only; elsewhere there is no boot clock to judge leases by (the wall rule holds).
BOOT_CLOCK: int | None = getattr(time, "CLOCK_BOOTTIME", None)


class SystemClock:
    """Wall time from the system, elapsed time from ``time.monotonic``, waits on the event loop."""

    # Its monotonic seconds are ``time.monotonic``'s (the watchdog's time).
    real_time = True

    def __call__(self) -> datetime:
        return self.now()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def boot_instant(self) -> BootInstant | None:
        """This host's boot clock: ``CLOCK_BOOTTIME`` (never stepped, shared by every
        process of the boot and time namespace), named by both; ``None`` where the
        kernel offers no boot id or clock."""
        name = boot_clock_name()
        if name is None or BOOT_CLOCK is None:
            return None
        return BootInstant(name, time.clock_gettime_ns(BOOT_CLOCK) // 1_000_000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> Deadline:
        return asyncio.timeout(seconds)


SYSTEM_CLOCK = SystemClock()


def system_clock() -> datetime:
    """The wall instant now (the system clock as a bare callable)."""
    return datetime.now(UTC)


def resolve_clock(clock: ClockLike | None) -> Clock:
    """The clock an entry point was given, the system clock when it was given none."""
    return SYSTEM_CLOCK if clock is None else as_clock(clock, SYSTEM_CLOCK)


def default_driver_name() -> str:
    """Host and process, for operators reading who holds a run (never used to fence)."""
    return f"{os.uname().nodename}:{os.getpid()}"


system_random: Callable[[], float] = random.random

# The process's one minter: one sequence per process keeps ids minted here in order.
mint_run_id = UlidMint(lambda: time.time_ns() // 1_000_000, os.urandom)


# --- This process and its neighbours, as the proof of a holder's death needs them ------


def read_text(path: str) -> str | None:
    """A small kernel file's text (``/proc``, ``/sys``); ``None`` where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as source:
            return source.read().strip()
    except OSError:
        return None


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 on (state first); the command name may hold spaces."""
    text = read_text(f"/proc/{pid}/stat")
    if text is None or ")" not in text:
        return None
    return text.rsplit(")", 1)[1].split()


def namespace_inode(kind: str) -> str | None:
    """The inode of this process's ``kind`` namespace (``pid``: which process table its
    pids index; ``time``: which boot-time offset its start times carry); ``None`` where
    ``/proc`` or the kernel has none."""
    try:
        link = os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None
    found = re.fullmatch(rf"{kind}:\[(\d+)\]", link)
    return found.group(1) if found else None


def own_start_ticks() -> int | None:
    """This process's start time (field 22 of its stat), read where others would read it;
    ``None`` unless ``/proc`` is the view of this process's own pid namespace.

    In a pid namespace under the host's ``/proc`` (``unshare --pid --fork`` without
    ``--mount-proc``), ``/proc/<our pid>`` is another process or none: there ``/proc/self``
    names another number than ``getpid()``, and ``NSpid`` lists more than one pid.
    """
    pid = os.getpid()
    try:
        if os.readlink("/proc/self") != str(pid):
            return None
    except OSError:
        return None
    status = read_text("/proc/self/status") or ""
    pids = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
    if pids != [[str(pid)]]:
        return None
    fields = stat_fields(pid)
    if fields is None or len(fields) <= 19 or not fields[19].isdigit():
        return None
    return int(fields[19])


def host_name() -> str:
    return os.uname().nodename


def current_pid() -> int:
    return os.getpid()


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a process now (zombies included); signal 0 checks only that,
    and works where ``/proc`` hides other users' processes."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, but belongs to someone else
    return True


# This process's identity, learnt once per pid (so a forked child learns its own).
_local: tuple[int, HolderIdentity] | None = None


def local_identity() -> HolderIdentity:
    """This process's identity, as a claim records it in ``lease_driver``."""
    global _local
    pid = current_pid()
    if _local is None or _local[0] != pid:
        start = own_start_ticks()
        _local = (
            pid,
            HolderIdentity(
                host=host_name(),
                boot=read_text("/proc/sys/kernel/random/boot_id"),
                pid_namespace=namespace_inode("pid"),
                time_namespace=namespace_inode("time"),
                # Without a /proc of our own, no pid of ours could be checked by anyone.
                pid=pid if start is not None else None,
                start_ticks=start,
            ),
        )
    return _local[1]


def boot_clock_name() -> str | None:
    """What names this process's boot clock: the boot id and the time namespace (its
    offset moves the clock); ``None`` where either clock or boot id is missing."""
    identity = local_identity()
    if BOOT_CLOCK is None or identity.boot is None:
        return None
    return f"{identity.boot}/{identity.time_namespace or '-'}"


def liveness_on_this_host(holder: HolderIdentity, here: HolderIdentity | None = None) -> Liveness:
    """Whether this host sees ``holder``'s process dead, alive, or cannot tell
    (``here``: the checker, this process by default)."""
    checker = local_identity() if here is None else here
    return liveness_seen_from(checker, holder, process_exists, stat_fields)


class ThisHost:
    """The host this process runs on, as the core's :class:`~jobrun._core.leases.holders.Host`."""

    def identity(self) -> HolderIdentity:
        return local_identity()

    def liveness(self, holder: HolderIdentity) -> Liveness:
        return liveness_on_this_host(holder)


THIS_HOST = ThisHost()
