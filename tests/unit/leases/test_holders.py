"""A holder's identity as a lease records it (described, parsed back), and the check by pid
that judges a holder only where its pid and start time mean what they say.

Fabricated identities, one per branch of ``liveness_seen_from`` (asked through
``liveness_on_this_host``, this host's answers); the same rules on real namespaces
are in ``tests/processes/test_holder_namespaces.py``, and how this process learns
its own identity in ``_host/test_system.py``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from jobrun._core.leases.holders import HolderIdentity, Liveness, parse_holder
from jobrun._host import system as _system
from jobrun._host.system import liveness_on_this_host
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


def test_a_described_identity_parses_back_field_for_field() -> None:
    identity = HolderIdentity(
        host="web-7",
        boot="5c1d-e9",
        pid_namespace="4026531836",
        time_namespace="4026531834",
        pid=4121,
        start_ticks=8934,
        presence=77,
    )
    text = identity.describe("worker-1/3")
    assert text == (
        "worker-1/3 [jobrun host=web-7 boot=5c1d-e9 pidns=4026531836 timens=4026531834 pid=4121 "
        "start=8934 presence=77]"
    )
    assert parse_holder(text) == identity


def test_an_identity_with_unknown_fields_leaves_them_out() -> None:
    text = HolderIdentity(host="mac").describe("a [b]")
    assert text == "a [b] [jobrun host=mac]"
    assert parse_holder(text) == HolderIdentity(host="mac")


@pytest.mark.parametrize(
    "lease_driver",
    [
        None,
        "",
        "worker-1",
        "worker-1 [jobrun host=a pid=12] and more",
        "worker-1 [jobrun host=a pid=twelve]",
        "worker-1 [jobrun host=a start=x]",
        "worker-1 [jobrun host=a presence=p]",
    ],
)
def test_a_driver_text_without_a_whole_identity_at_its_end_proves_nothing(
    lease_driver: str | None,
) -> None:
    assert parse_holder(lease_driver) is None


def test_an_identity_bracket_without_a_host_reads_as_an_unknown_host() -> None:
    assert parse_holder("w [jobrun pid=5]") == HolderIdentity(host="?", pid=5)


@pytest.mark.parametrize(
    ("boot", "pid_namespace"),
    [(None, None), ("other", None), (None, "other"), ("other", "same"), ("same", "other")],
)
def test_a_holder_in_another_process_table_is_never_proven_dead(
    boot: str | None, pid_namespace: str | None
) -> None:
    here = proc_identity()
    holder = HolderIdentity(
        host="x",
        boot=here.boot if boot == "same" else boot,
        pid_namespace=here.pid_namespace if pid_namespace == "same" else pid_namespace,
        time_namespace=here.time_namespace,
        pid=unused_pid(),
        start_ticks=1,
    )
    assert liveness_on_this_host(holder, here) is Liveness.UNKNOWN
    assert not holder.same_process_table(here)


def test_a_pid_gone_from_this_host_is_proven_dead() -> None:
    here = proc_identity()
    gone = replace(here, host="x", pid=unused_pid(), start_ticks=1)
    assert liveness_on_this_host(gone, here) is Liveness.DEAD
    assert liveness_on_this_host(gone) is Liveness.DEAD, "compared with this process by default"


@pytest.mark.parametrize("missing", ["pid", "start_ticks"])
def test_a_holder_without_pid_or_start_proves_nothing(missing: str) -> None:
    here = proc_identity()
    fields = {"pid": unused_pid(), "start_ticks": 1, missing: None}
    holder = replace(here, host="x", **fields)
    assert liveness_on_this_host(holder, here) is Liveness.UNKNOWN


def test_a_live_process_is_dead_only_when_its_pid_was_reused() -> None:
    here = proc_identity()
    assert liveness_on_this_host(here, here) is Liveness.ALIVE, "this very process is alive"
    assert here.start_ticks is not None
    reused = replace(here, start_ticks=here.start_ticks + 1)
    assert liveness_on_this_host(reused, here) is Liveness.DEAD, "same pid, another start: gone"


def test_a_zombie_holder_is_proven_dead(zombie: int) -> None:
    here = proc_identity()
    stat = Path(f"/proc/{zombie}/stat").read_text(encoding="ascii")
    start = int(stat.rsplit(")", 1)[1].split()[19])
    holder = replace(here, host="x", pid=zombie, start_ticks=start)
    assert liveness_on_this_host(holder, here) is Liveness.DEAD


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited but that its parent (this test) has not reaped yet."""
    child = subprocess.Popen(["true"])
    try:
        for _ in range(1000):
            state = Path(f"/proc/{child.pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1]
            if state.split()[0] == "Z":
                break
            # sleep: a poll interval; the loop count only bounds a hang
            time.sleep(0.01)
        else:
            raise AssertionError("the child never exited")
        yield child.pid
    finally:
        child.wait()


def test_the_presence_key_is_read_wherever_the_field_stands() -> None:
    assert parse_holder("w [jobrun presence=7 host=a pid=3 start=4]") == HolderIdentity(
        "a", pid=3, start_ticks=4, presence=7
    )
    assert parse_holder("w [jobrun host=a presence=7 pid=3]") == HolderIdentity(
        "a", pid=3, presence=7
    )
    identity = HolderIdentity("a", "b", "1", 2, 3, 2**63 - 1, "4")
    assert parse_holder(identity.describe("w")) == identity
