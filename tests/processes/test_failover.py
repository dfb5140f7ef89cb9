"""Failover to a streaming replica (issue 31 item 4), on a throwaway pair of clusters.

Each case makes a primary and a replica (``pg_createcluster``, ``pg_basebackup
-R``; ``tests/chaos/failover.py``), runs the chaos drivers (3 s lease, 100-200
ms bodies) and fails over while a body runs; the referee reads the bodies' own
log. Both clusters are dropped at the end, whatever happens. ``make chaos``
runs these and the asynchronous cases (with and without lag) and prints the
figures (``docs/explanation/promises.md``).

* Synchronous replication, the primary's WAL sender stopped 1.5 s before its
  machine dies: no overlapping bodies, no acknowledged step run again (a commit
  the replica had not received was never acknowledged), and the runs resume on
  the promoted server within the lease.
* Split brain (the old primary not fenced, still accepting writes): the driver
  on the promoted server takes over no run before that server's copy of its
  lease expires, and no two bodies overlap. Before presence keys carried their
  server's tag, it took the runs over within a second of the promotion (every
  presence of the old primary looks free on the new one): 21 overlapping pairs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.failover import Failover, SplitBrain
from tests.chaos.referee import read_bodies
from tests.chaos.stage import LEASE_MS, run_scenario

POSTGRES_URL = os.environ.get("JOBRUN_TEST_POSTGRES_URL", "")

pytestmark = [pytest.mark.postgres, pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.timeout(180)
async def test_failover_under_synchronous_replication_loses_no_acknowledged_step(
    tmp_path: Path,
) -> None:
    fault = Failover(lag_s=1.5, synchronous=True)
    outcome = await run_scenario(fault, "postgres", POSTGRES_URL, tmp_path)
    verdict = outcome.verdict
    print(f"\n{fault.name}: {verdict}; {outcome.notes}")
    assert not outcome.error, outcome.error
    assert verdict.bodies > 0
    assert verdict.overlaps == 0, verdict.overlapping
    assert verdict.acknowledged_repeats == 0
    assert outcome.lost == 0
    assert outcome.failed == 0
    # The promoted server's copies of the leases expire within one lease: a bound
    # on a hang, not a speed goal (the figure goes to the chaos table).
    assert verdict.resume_s is not None
    assert verdict.resume_s < LEASE_MS / 1000 + 2


@pytest.mark.timeout(240)
async def test_a_driver_on_the_promoted_server_takes_no_live_lease_early(tmp_path: Path) -> None:
    fault = SplitBrain()
    outcome = await run_scenario(fault, "postgres", POSTGRES_URL, tmp_path)
    verdict = outcome.verdict
    print(f"\n{fault.name}: {verdict}; {outcome.notes}")
    assert not outcome.error, outcome.error
    first_on_promoted: dict[str, int] = {}
    for body in read_bodies(tmp_path / "bodies.log"):
        if body.pid == fault.promoted_driver_pid:
            first_on_promoted.setdefault(body.run, body.start_ns)
    assert first_on_promoted, "the promoted server's driver never ran a body"
    # A run is taken early when the promoted server's driver starts it before both
    # that server's copy of the lease expired and its holder's process exited.
    early = {}
    for run, start_ns in first_on_promoted.items():
        expiry_ns, holder_pid = fault.leases.get(run, (0, None))
        dead_ns = fault.deaths.get(holder_pid, expiry_ns) if holder_pid else expiry_ns
        if start_ns < min(expiry_ns, dead_ns):
            early[run] = (min(expiry_ns, dead_ns) - start_ns) / 1e9
    assert not early, f"runs taken this many seconds before their lease expired: {early}"
    assert set(first_on_promoted) & set(fault.leases), "no run leased at the promotion was run"
    assert verdict.overlaps == 0, verdict.overlapping
    assert outcome.lost == 0
    assert outcome.failed == 0
