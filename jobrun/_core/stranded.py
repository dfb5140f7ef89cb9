"""Runs stranded by a holder that can no longer run a step body, found so they are taken over early.

A run is taken over before its lease expires only on proof that its holder
cannot run a step body any more (see ``docs/design.md``, "Proof of death"):

* **Its process is gone**, seen from a host that can truly see it (same boot,
  pid namespace and time namespace: :func:`jobrun._core.holders.died_on_this_host`).
  Taken over at once.
* **Its presence session ended and the grace period passed.** A session that
  ended proves only that a connection ended: ``idle_session_timeout``, a proxy
  or a network cut end the sessions of live processes. A live holder checks its
  own presence every ``PRESENCE_CHECK_INTERVAL_S`` and stops its bodies within
  ``PRESENCE_DETECTION_S`` of losing it, so a claimer that has seen the presence
  free for ``PRESENCE_GRACE_S`` knows no body of that holder still runs.

A held presence is proof of life: it outranks any same-host guess. Nothing
proven either way (no presence, another host): the lease's expiry decides.

Finding them costs one read (``held_leases``: the running runs whose lease has
not expired, a range of the due index) plus, per holder on this host, a look at
``/proc``. A driver process does it at its first claim on a store, then at most
once per ``SCAN_INTERVAL_S`` whatever the number of drivers in the process.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from jobrun import _system
from jobrun._core.holders import Liveness, liveness_on_this_host, parse_holder
from jobrun._core.port import JobRunStore
from jobrun._core.records import HeldLease

SCAN_INTERVAL_S = 1.0
# A live holder runs a round trip on its presence session this often...
PRESENCE_CHECK_INTERVAL_S = 0.5
# ...and gives up on one that has not answered in this long:
PRESENCE_CHECK_TIMEOUT_S = 1.0
# so it knows of a lost presence within this, and then cancels its bodies.
PRESENCE_DETECTION_S = PRESENCE_CHECK_INTERVAL_S + PRESENCE_CHECK_TIMEOUT_S
# A claimer waits this long after first seeing a presence free: the detection
# bound plus as much again for an event loop slowed by load.
PRESENCE_GRACE_S = 3.0

Jobs = frozenset[tuple[str, str]]


@dataclass(slots=True)
class _Scan:
    scanned_at: float | None = None
    # Dead holders' tokens, by the run each held; dropped once that run is claimed.
    dead: dict[str, str] = field(default_factory=dict)
    # When this process first saw each token's presence free (monotonic seconds).
    free_since: dict[str, float] = field(default_factory=dict)
    # Whether the last scan saw any unexpired lease at all (a holder that may die).
    held: bool = False


_scans: weakref.WeakKeyDictionary[object, dict[Jobs | None, _Scan]] = weakref.WeakKeyDictionary()


def holder_is_dead(lease: HeldLease, presence_free_for_s: float | None = None) -> bool:
    """Proof, not suspicion, that ``lease``'s holder runs no step body.

    ``presence_free_for_s``: how long this process has seen the holder's
    presence free (``None``: not seen free, or not known)."""
    if lease.presence_held is True:
        return False  # a held presence is proof of life, whatever /proc suggests
    holder = parse_holder(lease.lease_driver)
    if holder is not None and liveness_on_this_host(holder) is Liveness.DEAD:
        return True
    if lease.presence_held is False:
        return presence_free_for_s is not None and presence_free_for_s >= PRESENCE_GRACE_S
    return False


async def dead_holders(
    store: JobRunStore, now_at: str, jobs: Jobs | None, scan: _Scan | None = None
) -> list[HeldLease]:
    """The unexpired leases of ``jobs`` whose holders are provably dead (one read).

    Without a ``scan`` to remember presences seen free before, a free presence
    proves nothing yet (an operator's one-off look)."""
    leases = await store.held_leases(now_at, jobs)
    if scan is None:
        return [lease for lease in leases if holder_is_dead(lease)]
    now_s = _system.monotonic_s()
    free_since = {
        lease.lease_owner: scan.free_since.get(lease.lease_owner, now_s)
        for lease in leases
        if lease.presence_held is False
    }
    # Tokens no longer held are forgotten: a token is never leased again.
    scan.free_since = free_since
    scan.held = bool(leases)
    return [
        lease
        for lease in leases
        if holder_is_dead(lease, _elapsed(free_since.get(lease.lease_owner), now_s))
    ]


def _elapsed(since_s: float | None, now_s: float) -> float | None:
    return None if since_s is None else now_s - since_s


async def dead_owners(store: JobRunStore, now_at: str, jobs: Jobs) -> frozenset[str]:
    """Tokens of dead holders to take over, scanning again when the last scan is old."""
    scan = _scans.setdefault(store, {}).setdefault(jobs, _Scan())
    now = _system.monotonic_s()
    if scan.scanned_at is None or now - scan.scanned_at >= SCAN_INTERVAL_S:
        scan.scanned_at = now
        found = await dead_holders(store, now_at, jobs, scan)
        scan.dead = {lease.lease_owner: lease.run_id for lease in found}
    return frozenset(scan.dead)


def suspects(store: JobRunStore) -> bool:
    """Whether a scan on ``store`` saw a presence free that is not proven dead yet."""
    return any(
        token not in scan.dead
        for scan in _scans.get(store, {}).values()
        for token in scan.free_since
    )


def leases_held(store: JobRunStore) -> bool:
    """Whether the last scan on ``store`` saw unexpired leases: their holders may die,
    and an idle driver that looks again every ``SCAN_INTERVAL_S`` takes a dead one's
    runs over within about a second of the proof (instead of its idle interval)."""
    return any(scan.held for scan in _scans.get(store, {}).values())


def claimed(store: JobRunStore, jobs: Jobs, run_id: str) -> None:
    """A run was claimed: it is nobody's orphan any more."""
    scan = _scans.get(store, {}).get(jobs)
    if scan is not None and scan.dead:
        scan.dead = {token: held for token, held in scan.dead.items() if held != run_id}
