"""The real host as the core sees it (``jobrun/_host/system.py``): this process's identity,
read from its own ``/proc`` or left unknown where that ``/proc`` is not its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobrun._core.leases.holders import Liveness
from jobrun._host import system as _system
from jobrun._host.system import liveness_on_this_host, local_identity
from tests.support import proc_identity


def test_this_process_knows_its_own_identity() -> None:
    here = proc_identity()
    stat = Path("/proc/self/stat").read_text(encoding="ascii")
    assert here.pid == os.getpid()
    assert here.start_ticks == int(stat.rsplit(")", 1)[1].split()[19])
    assert here.host == os.uname().nodename
    assert here.pid_namespace == os.readlink("/proc/self/ns/pid")[len("pid:[") : -1]
    if Path("/proc/self/ns/time").exists():
        assert here.time_namespace == os.readlink("/proc/self/ns/time")[len("time:[") : -1]
    assert here.boot == Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    assert local_identity() is here, "learnt once per process"


def test_a_process_without_a_proc_of_its_own_records_no_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc_identity()
    monkeypatch.setattr(_system, "_local", None)
    monkeypatch.setattr(_system, "own_start_ticks", lambda: None)
    blind = _system.local_identity()
    assert (blind.pid, blind.start_ticks) == (None, None)
    assert blind.boot is not None, "the rest is still recorded, for operators"
    assert " pid=" not in blind.describe("w")
    assert liveness_on_this_host(blind, blind) is Liveness.UNKNOWN


def test_own_start_ticks_reads_this_processs_stat() -> None:
    proc_identity()
    stat = Path(f"/proc/{os.getpid()}/stat").read_text(encoding="ascii")
    assert _system.own_start_ticks() == int(stat.rsplit(")", 1)[1].split()[19])


def test_own_start_ticks_refuses_a_proc_of_an_outer_pid_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc_identity()
    read_text = _system.read_text
    # What /proc/self/status shows in a child pid namespace under the host's /proc.
    nested = f"Name:\tpython\nNSpid:\t{os.getpid()}\t2\n"
    monkeypatch.setattr(
        _system,
        "read_text",
        lambda path: nested if path == "/proc/self/status" else read_text(path),
    )
    assert _system.own_start_ticks() is None


def test_the_system_clock_reads_the_boot_clock_under_its_name() -> None:
    here = proc_identity()
    first = _system.SYSTEM_CLOCK.boot_instant()
    assert first is not None
    assert first.boot_id == f"{here.boot}/{here.time_namespace or '-'}"
    # CLOCK_BOOTTIME, not the wall clock: milliseconds since boot, never going back.
    since_boot_s = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
    assert abs(first.ms / 1000 - since_boot_s) < 60
    second = _system.SYSTEM_CLOCK.boot_instant()
    assert second is not None
    assert second.ms >= first.ms
    assert first.lease_id("T") == f"{first.boot_id}@T"


def test_no_boot_clock_without_a_boot_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_system, "_local", None)
    monkeypatch.setattr(_system, "read_text", lambda path: None)
    assert _system.SYSTEM_CLOCK.boot_instant() is None
