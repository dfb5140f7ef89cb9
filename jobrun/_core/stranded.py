"""Runs stranded by a holder that is provably dead, found so they are taken over at once.

Finding them costs one read (``held_leases``: the running runs whose lease has
not expired, a range of the due index) plus, per holder on this host, a look
at ``/proc``. A driver process does it at its first claim on a store, then at
most once per ``SCAN_INTERVAL_S`` whatever the number of drivers in the
process: a restarted process takes its predecessor's runs over at its first
claim, and a running one notices a death elsewhere within about a second of
its next claim.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from jobrun import _system
from jobrun._core.holders import Liveness, liveness_on_this_host, parse_holder
from jobrun._core.port import JobRunStore
from jobrun._core.records import HeldLease

SCAN_INTERVAL_S = 1.0

Jobs = frozenset[tuple[str, str]]


@dataclass(slots=True)
class _Scan:
    scanned_at: float | None = None
    # Dead holders' tokens, by the run each held; dropped once that run is claimed.
    dead: dict[str, str] = field(default_factory=dict)


_scans: weakref.WeakKeyDictionary[object, dict[Jobs | None, _Scan]] = weakref.WeakKeyDictionary()


def holder_is_dead(lease: HeldLease) -> bool:
    """Proof, not suspicion: the database saw the presence end, or this host sees
    the process gone."""
    if lease.presence_held is False:
        return True
    holder = parse_holder(lease.lease_driver)
    return holder is not None and liveness_on_this_host(holder) is Liveness.DEAD


async def dead_holders(store: JobRunStore, now_at: str, jobs: Jobs | None) -> list[HeldLease]:
    """The unexpired leases of ``jobs`` whose holders are provably dead (one read)."""
    return [lease for lease in await store.held_leases(now_at, jobs) if holder_is_dead(lease)]


async def dead_owners(store: JobRunStore, now_at: str, jobs: Jobs) -> frozenset[str]:
    """Tokens of dead holders to take over, scanning again when the last scan is old."""
    scan = _scans.setdefault(store, {}).setdefault(jobs, _Scan())
    now = _system.monotonic_s()
    if scan.scanned_at is None or now - scan.scanned_at >= SCAN_INTERVAL_S:
        scan.scanned_at = now
        found = await dead_holders(store, now_at, jobs)
        scan.dead = {lease.lease_owner: lease.run_id for lease in found}
    return frozenset(scan.dead)


def claimed(store: JobRunStore, jobs: Jobs, run_id: str) -> None:
    """A run was claimed: it is nobody's orphan any more."""
    scan = _scans.get(store, {}).get(jobs)
    if scan is not None and scan.dead:
        scan.dead = {token: held for token, held in scan.dead.items() if held != run_id}
