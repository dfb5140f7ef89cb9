"""An idle worker sees a dead peer as fast as a busy one (issue 31 item 1).

Two ``jobrun worker`` processes with library defaults (a one-minute lease) over one
database; the one holding the only run is killed with kill -9 while the other is
idle. The survivor must take the run over on proof of death, not at the lease's
expiry: the takeover is measured against the lease (more than 30 s of it left when
the survivor's first body begins), the way the other process tests measure
lateness, never against a tight number of seconds. The figures are printed (``-s``).

Before the fix the survivor waited out the lease on both dialects (56-58 s): an idle
database was driven only when its next-due read found a run due, and a leased run
is due only at its expiry, so the dead-holder scan inside the claim never ran.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.processes.survivor import idle_survivor_takeover
from tests.support import proc_identity

SQLITE = pytest.param("sqlite", id="sqlite")
POSTGRES = pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)
# Lateness against the lease (a minute): at once means long before it runs out.
LEFT_AT_LEAST_S = 30.0


@pytest.mark.parametrize("backend", [SQLITE, POSTGRES])
async def test_an_idle_worker_takes_a_killed_peers_run_over_long_before_the_lease_ends(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    proc_identity()  # the proof on this host is the holder's pid
    takeover = await idle_survivor_takeover(database_url, tmp_path)
    print(
        f"\n{backend}, same host: kill -9 -> survivor's first body {takeover.latency_s:.2f} s, "
        f"{takeover.lease_left_s:.1f} s of the dead holder's lease left"
    )
    assert takeover.lease_left_s > LEFT_AT_LEAST_S, "waited for the lease, not for the proof"


@pytest.mark.postgres
@pytest.mark.parametrize("backend", [POSTGRES])
async def test_an_idle_worker_on_another_host_takes_over_through_the_presence(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    takeover = await idle_survivor_takeover(database_url, tmp_path, foreign=True)
    print(
        f"\n{backend}, another host: kill -9 -> survivor's first body "
        f"{takeover.latency_s:.2f} s, {takeover.lease_left_s:.1f} s of the lease left"
    )
    assert takeover.lease_left_s > LEFT_AT_LEAST_S, "waited for the lease, not for the presence"


def _own_pid_namespace() -> list[str]:
    """``unshare`` into a pid namespace with a ``/proc`` of its own; skips where refused."""
    proc_identity()
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run([*command, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare refused here: {probe.stderr.strip()}")
    return command


@pytest.mark.postgres
@pytest.mark.parametrize("backend", [POSTGRES])
async def test_an_idle_worker_in_another_pid_namespace_takes_over_through_the_presence(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    """Across pid namespaces the pid proves nothing (unknown, never dead): the
    presence lock, free for the grace period, is the proof."""
    prefix = _own_pid_namespace()
    takeover = await idle_survivor_takeover(database_url, tmp_path, survivor_prefix=prefix)
    print(
        f"\n{backend}, another pid namespace: kill -9 -> survivor's first body "
        f"{takeover.latency_s:.2f} s, {takeover.lease_left_s:.1f} s of the lease left"
    )
    assert takeover.lease_left_s > LEFT_AT_LEAST_S, "waited for the lease, not for the presence"
