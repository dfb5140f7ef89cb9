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

import asyncio
import collections
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
import jobrun.worker.deaths
import jobrun.worker.driving
from jobrun._core.leases import proof_of_death as orphans
from jobrun._core.model.formats import format_instant
from jobrun.testing import FakeClock
from tests.processes.survivor import idle_survivor_takeover
from tests.processes.test_worker import eventually
from tests.processes.worker_app import registry
from tests.support import claim_as, proc_identity, set_columns

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


@pytest.mark.parametrize("backend", [SQLITE, POSTGRES])
async def test_the_many_database_worker_takes_a_killed_peers_run_over_too(
    backend: str, database_url: str, sqlite_template: Path, tmp_path: Path
) -> None:
    """``--urls-file`` over a dozen SQLite files and the test's database (the run is
    there): the idle database among idle others is looked at all the same."""
    proc_identity()
    urls = []
    for number in range(12):
        path = tmp_path / f"scope-{number:02d}.db"
        shutil.copyfile(sqlite_template, path)
        urls.append(f"sqlite+aiosqlite:///{path}")
    urls.insert(6, database_url)
    listed = tmp_path / "urls.txt"
    listed.write_text("\n".join(urls) + "\n")
    takeover = await idle_survivor_takeover(
        database_url, tmp_path, where=("--urls-file", str(listed))
    )
    print(
        f"\n{backend}, --urls-file of {len(urls)}: kill -9 -> survivor's first body "
        f"{takeover.latency_s:.2f} s, {takeover.lease_left_s:.1f} s of the lease left"
    )
    assert takeover.lease_left_s > LEFT_AT_LEAST_S, "waited for the lease, not for the proof"


# --- when an idle worker looks again, on a test clock -------------------------------------------


def _live_holder() -> tuple[subprocess.Popen[bytes], str]:
    """A process of ours standing for a peer worker, and a ``lease_driver`` naming it."""
    here = proc_identity()
    peer = subprocess.Popen(["sleep", "3600"])
    stat = Path(f"/proc/{peer.pid}/stat").read_text(encoding="ascii")
    start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return peer, replace(here, host="peer", pid=peer.pid, start_ticks=start_ticks).describe("peer")


# The worker's waits on the test clock: the idle driver's, and the heartbeat of its
# registration in the database, put off for the test's length.
QUIET: dict[str, Any] = {"interval_s": 30, "heartbeat_s": 3600}
SLEEPERS = 2


def _scan_of(store: jobrun.SqlJobRunStore) -> Any:
    return store.orphan_scans.get(frozenset((job.module_id, job.name) for job in registry))


@pytest.mark.parametrize("backend", [SQLITE, POSTGRES])
async def test_an_idle_worker_looks_again_at_each_death_check_and_acts_on_the_proof(
    backend: str, engine: AsyncEngine
) -> None:
    """On a clock that moves only when told: while a live peer holds the only run
    (a minute's lease), the idle worker reads the held leases every IDLE_LOOK_S and
    leaves the run alone; once the peer is dead, the next look, not the expiry 59 s
    later, hands the run to a claim."""
    clock = FakeClock(datetime.now(UTC))
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(
        store, module_id="demo", job="pages", payload={"pages": 1}, clock=clock
    )
    peer, driver = _live_holder()
    try:
        assert await claim_as(
            store, clock, "PEER", driver=driver, lease_ms=60_000, job=("demo", "pages")
        )
        stop = asyncio.Event()
        worker = asyncio.create_task(
            jobrun.run_worker([store], registry, stop=stop, clock=clock, **QUIET)
        )
        try:
            await _looked_at(store, clock, 0.0)
            clock.advance(seconds=orphans.IDLE_LOOK_S)
            await _looked_at(store, clock, orphans.IDLE_LOOK_S)
            held = await jobrun.get_job_run(store, run.id)
            assert held is not None
            assert held.lease_driver == driver, "a live peer's run was taken"
            peer.kill()
            peer.wait()
            clock.advance(seconds=orphans.IDLE_LOOK_S)
            await eventually(lambda: _done(store, run.id), timeout_s=60)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 60)
    finally:
        peer.kill()
        peer.wait()
    # The clock moved one second in all: the peer's lease had 59 s left.
    assert clock.monotonic() == 2 * orphans.IDLE_LOOK_S


async def _looked_at(store: jobrun.SqlJobRunStore, clock: FakeClock, at_s: float) -> None:
    """Wait until the worker has looked at the held leases at ``at_s`` on the clock and
    is waiting on the clock again (the idle driver and the heartbeat, nothing else)."""

    async def looked() -> bool:
        scan = _scan_of(store)
        return scan is not None and scan.scanned_at == at_s and clock.sleepers >= SLEEPERS

    await eventually(looked, timeout_s=60)


async def _done(store: jobrun.SqlJobRunStore, run_id: str) -> bool:
    found = await jobrun.get_job_run(store, run_id)
    return found is not None and found.status == "done"


async def test_while_nothing_is_written_an_idle_sqlite_worker_looks_without_reading(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every change to a lease is a write to the file, which inotify reports: with none
    since the last read, a look re-judges the leases it read (pid checks only), and
    the due instant stands. A write makes the next look read again."""
    reads: collections.Counter[str] = collections.Counter()

    def counted(name: str, read: Callable[..., Any]) -> Callable[..., Any]:
        def reading(*arguments: Any) -> Any:
            reads[name] += 1
            return read(*arguments)

        return reading

    monkeypatch.setattr(
        jobrun.worker.deaths,
        "sqlite_held_leases",
        counted("leases", jobrun.worker.deaths.sqlite_held_leases),
    )
    monkeypatch.setattr(
        jobrun.worker.driving,
        "sqlite_next_due",
        counted("due", jobrun.worker.driving.sqlite_next_due),
    )
    engine = create_async_engine(sqlite_url)
    clock = FakeClock(datetime.now(UTC))
    store = jobrun.SqlJobRunStore(engine)
    run = await jobrun.start_job_run(
        store, module_id="demo", job="pages", payload={"pages": 1}, clock=clock
    )
    peer, driver = _live_holder()
    stop = asyncio.Event()
    try:
        assert await claim_as(
            store, clock, "PEER", driver=driver, lease_ms=60_000, job=("demo", "pages")
        )
        worker = asyncio.create_task(
            jobrun.run_worker([store], registry, stop=stop, clock=clock, **QUIET)
        )
        await _looked_at(store, clock, 0.0)
        # One look first: the registration's first heartbeat, a write, is read by then.
        clock.advance(seconds=orphans.IDLE_LOOK_S)
        await _looked_at(store, clock, orphans.IDLE_LOOK_S)
        read_first = dict(reads)
        for look in range(2, 6):
            clock.advance(seconds=orphans.IDLE_LOOK_S)
            await _looked_at(store, clock, look * orphans.IDLE_LOOK_S)
        assert dict(reads) == read_first, "a look read the file with nothing written"
        # A write (any process's): the driver wakes, reads the due instant, and its
        # next look reads the leases again.
        await set_columns(store, engine, run.id, updated_at=format_instant(clock.now()))
        await eventually(lambda: _more(reads, "due", read_first["due"]), timeout_s=60)
        clock.advance(seconds=orphans.IDLE_LOOK_S)
        await eventually(lambda: _more(reads, "leases", read_first["leases"]), timeout_s=60)
        held = await jobrun.get_job_run(store, run.id)
        assert held is not None
        assert held.lease_driver == driver, "a live peer's run was taken"
    finally:
        stop.set()
        peer.kill()
        peer.wait()
        await asyncio.wait_for(worker, 60)
        await engine.dispose()


async def _more(reads: collections.Counter[str], name: str, than: int) -> bool:
    return reads[name] > than
