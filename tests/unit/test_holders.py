"""The check by pid judges a holder only where its pid and start time mean what they say.

Fabricated identities, one per branch of ``liveness_on_this_host``; the same
rules on real namespaces are in ``tests/processes/test_holder_namespaces.py``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from jobrun import _system
from jobrun._core.holders import HolderIdentity, Liveness, parse_holder
from jobrun._system import liveness_on_this_host
from tests.support import proc_identity, unused_pid


def _gone(here: HolderIdentity) -> HolderIdentity:
    """A holder in this process's namespaces whose pid no process has."""
    return replace(here, host="gone", pid=unused_pid(), start_ticks=1)


def test_an_older_holders_bracket_without_a_time_namespace_still_parses() -> None:
    text = "worker-1 [jobrun host=web-7 boot=5c1d pidns=4026531836 pid=4121 start=8934]"
    assert parse_holder(text) == HolderIdentity(
        host="web-7", boot="5c1d", pid_namespace="4026531836", pid=4121, start_ticks=8934
    )


def test_a_field_name_counts_only_at_the_start_of_a_word() -> None:
    assert parse_holder("w [jobrun host=a xpid=5 mystart=6]") == HolderIdentity(host="a")


@pytest.mark.parametrize("field", ["boot", "pid_namespace", "time_namespace"])
def test_a_holder_in_another_boot_or_namespace_is_unknown_alive_or_gone(field: str) -> None:
    here = proc_identity()
    for holder in (here, _gone(here)):
        elsewhere = replace(holder, **{field: "another"})
        assert liveness_on_this_host(elsewhere, here) is Liveness.UNKNOWN, field


def test_the_same_host_name_on_another_boot_is_unknown() -> None:
    here = proc_identity()
    rebooted = replace(here, boot="another-boot")
    assert rebooted.host == here.host
    assert liveness_on_this_host(rebooted, here) is Liveness.UNKNOWN


def test_another_host_name_on_this_kernel_and_namespaces_is_judged_by_pid() -> None:
    here = proc_identity()
    assert liveness_on_this_host(replace(here, host="container-a"), here) is Liveness.ALIVE
    assert liveness_on_this_host(_gone(here), replace(here, host="container-b")) is Liveness.DEAD


def test_a_time_namespace_known_on_one_side_only_is_unknown() -> None:
    here = replace(proc_identity(), time_namespace="4026531834")
    for holder in (here, _gone(here)):
        older = replace(holder, time_namespace=None)
        assert liveness_on_this_host(older, here) is Liveness.UNKNOWN, "holder lacks it"
        assert liveness_on_this_host(holder, older) is Liveness.UNKNOWN, "checker lacks it"


def test_a_kernel_without_time_namespaces_is_judged_by_pid() -> None:
    here = replace(proc_identity(), time_namespace=None)
    assert liveness_on_this_host(here, here) is Liveness.ALIVE
    assert liveness_on_this_host(_gone(here), here) is Liveness.DEAD


@pytest.mark.parametrize("missing", ["pid", "start_ticks"])
def test_a_checker_without_a_proc_of_its_own_judges_nothing(missing: str) -> None:
    here = proc_identity()
    blind = replace(here, **{missing: None})
    assert liveness_on_this_host(_gone(here), blind) is Liveness.UNKNOWN
    assert liveness_on_this_host(here, blind) is Liveness.UNKNOWN


def test_a_holder_whose_stat_cannot_be_read_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    here = proc_identity()
    monkeypatch.setattr(_system, "stat_fields", lambda pid: None)
    assert liveness_on_this_host(here, here) is Liveness.UNKNOWN


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
