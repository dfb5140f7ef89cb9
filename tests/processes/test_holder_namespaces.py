"""The check by pid in real namespaces: a live holder is never judged dead.

Holders and checkers run in ``unshare``/``nsenter`` (``holder_child.py``): a pid
namespace under the host's ``/proc`` (where a holder's pid is its namespace's pid
but ``/proc`` is the host's), a pid namespace with its own ``/proc``, a time
namespace with a boot-time offset (where ``/proc/<pid>/stat`` start times are
shifted for the reader). Across them the answer is ``unknown``; within one set of
namespaces a dead holder is still ``dead``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobrun._core.leases.holders import Liveness, parse_holder
from jobrun._host.system import liveness_on_this_host, local_identity
from tests.support import REPO, proc_identity

CHILD = Path(__file__).parent / "holder_child.py"
ENVIRONMENT = dict(os.environ, PYTHONPATH=str(REPO))
PID_UNDER_HOST_PROC = ("--pid", "--fork")
PID_WITH_OWN_PROC = ("--pid", "--fork", "--mount-proc")
TIME_OFFSET = ("--time", "--boottime", "1000")


def _unshare(*options: str) -> list[str]:
    """``unshare OPTIONS`` as a command prefix; skips where the tool or the kernel refuses."""
    proc_identity()
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) is not installed")
    probe = subprocess.run(
        ["unshare", *options, "true"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        pytest.skip(f"unshare {' '.join(options)} refused here: {probe.stderr.strip()}")
    return ["unshare", *options]


@contextlib.contextmanager
def _holder(*prefix: str) -> Iterator[tuple[dict[str, Any], subprocess.Popen[str]]]:
    """A ``hold`` child under ``prefix``: its printed line, and the process (ended on exit)."""
    process = subprocess.Popen(
        [*prefix, sys.executable, str(CHILD), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENVIRONMENT,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"the holder printed nothing: {process.communicate(timeout=30)[1]}"
        yield json.loads(line), process
    finally:
        process.communicate(timeout=30)  # closes stdin: the holder returns


def _run_child(prefix: list[str], *arguments: str) -> str:
    done = subprocess.run(
        [*prefix, sys.executable, str(CHILD), *arguments],
        capture_output=True,
        text=True,
        env=ENVIRONMENT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _check(prefix: list[str], text: str) -> str:
    """What a checker under ``prefix`` answers for the holder ``text``."""
    return _run_child(prefix, "check", text)


def _start_ticks(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat`` as this process reads it."""
    return int(Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[19])


def _only_child(pid: int) -> int:
    """The one child of ``pid`` (``unshare --fork`` runs the command in a child)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[1] == str(
                    pid
                ):
                    children.append(int(entry.name))
    assert len(children) == 1, children
    return children[0]


def test_a_holder_in_a_pid_namespace_under_the_hosts_proc_is_never_judged_dead() -> None:
    prefix = _unshare(*PID_UNDER_HOST_PROC)
    with _holder(*prefix) as (seen, _):
        holder = parse_holder(seen["identity"])
        assert holder is not None
        # It is pid 1 of its namespace, yet /proc/self names its pid on the host.
        assert seen["proc_self"] != "1"
        assert (holder.pid, holder.start_ticks) == (None, None), "it cannot name its process"
        assert liveness_on_this_host(holder) is Liveness.UNKNOWN, "checked from the host"
        same_namespace = ["nsenter", "--target", seen["proc_self"], "--pid"]
        assert _check(same_namespace, seen["identity"]) == "unknown"


def test_a_holder_with_a_proc_of_its_own_is_judged_only_through_one_too() -> None:
    prefix = _unshare(*PID_WITH_OWN_PROC)
    with _holder(*prefix) as (seen, process):
        holder = parse_holder(seen["identity"])
        assert holder is not None
        assert holder.pid == 1, "its own /proc: it knows its own pid and start"
        assert holder.start_ticks is not None
        assert liveness_on_this_host(holder) is Liveness.UNKNOWN, "another pid namespace"
        target = ["nsenter", "--target", str(_only_child(process.pid))]
        # In its pid namespace but under the host's /proc, pid 1 is the host's init.
        assert _check([*target, "--pid"], seen["identity"]) == "unknown"
        assert _check([*target, "--pid", "--mount"], seen["identity"]) == "alive"


def test_a_holder_in_a_time_namespace_is_never_judged_dead_from_outside() -> None:
    prefix = _unshare(*TIME_OFFSET)
    with _holder(*prefix) as (seen, process):
        holder = parse_holder(seen["identity"])
        assert holder is not None
        assert holder.pid == process.pid, "one pid namespace: the same pid on both sides"
        assert holder.start_ticks is not None
        # The fault is real: read from here, its start time is 1000 s earlier.
        assert holder.start_ticks != _start_ticks(process.pid)
        assert liveness_on_this_host(holder) is Liveness.UNKNOWN
        same_clock = ["nsenter", "--target", str(process.pid), "--time"]
        assert _check(same_clock, seen["identity"]) == "alive"


def test_a_holder_outside_is_never_judged_dead_from_a_time_namespace() -> None:
    prefix = _unshare(*TIME_OFFSET)
    assert _check(prefix, local_identity().describe("outside")) == "unknown"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        pytest.param((), ("alive", "dead"), id="host"),
        pytest.param(PID_WITH_OWN_PROC, ("alive", "dead"), id="pid-own-proc"),
        pytest.param(TIME_OFFSET, ("alive", "dead"), id="time"),
        pytest.param(PID_WITH_OWN_PROC + TIME_OFFSET, ("alive", "dead"), id="pid-own-proc-time"),
        pytest.param(PID_UNDER_HOST_PROC, ("unknown", "unknown"), id="pid-host-proc"),
    ],
)
def test_a_holder_in_the_checkers_own_namespaces_is_judged(
    options: tuple[str, ...], expected: tuple[str, str]
) -> None:
    prefix = _unshare(*options) if options else []
    answers = json.loads(_run_child(prefix, "pair"))
    assert (answers["alive"], answers["dead"]) == expected, answers


def test_a_host_name_proves_nothing_and_another_boot_id_forbids_judging() -> None:
    proc_identity()
    with _holder() as (seen, _):
        holder = parse_holder(seen["identity"])
        assert holder is not None
        renamed = replace(holder, host="another-container")
        rebooted = replace(holder, boot="another-boot")
        assert liveness_on_this_host(renamed) is Liveness.ALIVE
        assert liveness_on_this_host(rebooted) is Liveness.UNKNOWN
    assert liveness_on_this_host(renamed) is Liveness.DEAD, "reaped: gone on this host"
    assert liveness_on_this_host(rebooted) is Liveness.UNKNOWN
