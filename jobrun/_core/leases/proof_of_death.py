"""Orphaned runs: leased by a holder proven unable to run a step body, taken over early.

A run is taken over before its lease expires only on proof that its holder
cannot run a step body any more (see ``docs/design.md``, "Proof of death"):

* **Its process is gone**, seen from a host that can truly see it (same boot,
  pid namespace and time namespace: :func:`jobrun._core.leases.holders.died_on_this_host`).
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
``/proc`` (through the :class:`~jobrun._core.leases.holders.Host` the caller hands in).
A driver process does it at its first claim on a store, then at most once per
``SCAN_INTERVAL_S`` whatever the number of drivers in the process. A worker with
nothing due reads the same leases itself, without claiming (``look_due``,
``judge_leases``), every ``IDLE_LOOK_S`` while another process holds a lease of
its jobs there (``look_again_in_s``), and drives only when a holder is proven
dead: a leased run is due only at its expiry, so waiting for it to come due would
wait out the dead holder's lease.

What the scans have seen is kept by the store object (``orphan_scans``), the
one thing every drive of a database in this process shares, the way it keeps
its owed releases: it lasts as long as the store handle and no longer. Time
between scans, and how long a presence has been seen free, is read from the
drive's clock (``clock.monotonic()``), so a test clock moves it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from jobrun._core.leases.holders import HolderIdentity, Host, Liveness, parse_holder
from jobrun._core.model.records import HeldLease

SCAN_INTERVAL_S = 1.0
# An idle worker's looks, while another process holds a lease: half the scan
# interval, so a death proven by pid is acted on within a second even when the
# look, the claim and the pass's start run late on a loaded machine.
IDLE_LOOK_S = 0.5
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
    # When this process first saw each token's presence free (the drive clock's monotonic s).
    free_since: dict[str, float] = field(default_factory=dict)
    # Whether the last scan saw an unexpired lease of another process (a holder that
    # may die; this process's own leases end with it, and prove nothing here).
    held: bool = False


class OrphanScans:
    """What the scans of one store have seen, per set of jobs (kept by the store)."""

    def __init__(self) -> None:
        self._scans: dict[Jobs | None, _Scan] = {}

    def of(self, jobs: Jobs) -> _Scan:
        return self._scans.setdefault(jobs, _Scan())

    def get(self, jobs: Jobs) -> _Scan | None:
        return self._scans.get(jobs)

    def __iter__(self) -> Iterator[_Scan]:
        return iter(self._scans.values())


class LeaseReader(Protocol):
    """What the proof of death needs of a store: every store of the port is one. Named
    here, not as the port, so the port can keep this module's scans without a circle."""

    @property
    def orphan_scans(self) -> OrphanScans: ...

    async def held_leases(
        self, now_at: str, jobs: frozenset[tuple[str, str]] | None
    ) -> list[HeldLease]: ...


def holder_is_dead(
    lease: HeldLease, presence_free_for_s: float | None = None, *, host: Host
) -> bool:
    """Proof, not suspicion, that ``lease``'s holder runs no step body.

    ``presence_free_for_s``: how long this process has seen the holder's
    presence free (``None``: not seen free, or not known); ``host`` judges a
    holder by its process, where this host can see it."""
    if lease.presence_held is True:
        return False  # a held presence is proof of life, whatever /proc suggests
    holder = parse_holder(lease.lease_driver)
    if holder is not None and host.liveness(holder) is Liveness.DEAD:
        return True
    if lease.presence_held is False:
        return presence_free_for_s is not None and presence_free_for_s >= PRESENCE_GRACE_S
    return False


async def dead_holders(
    store: LeaseReader, now_at: str, jobs: Jobs | None, host: Host
) -> list[HeldLease]:
    """The unexpired leases of ``jobs`` whose holders are provably dead (one read).

    With no scan to remember presences seen free before, a free presence
    proves nothing yet (an operator's one-off look)."""
    leases = await store.held_leases(now_at, jobs)
    return [lease for lease in leases if holder_is_dead(lease, host=host)]


def _judge(leases: list[HeldLease], host: Host, scan: _Scan, now_s: float) -> list[HeldLease]:
    """The leases of provably dead holders among ``leases`` (read at ``now_s``),
    remembering in ``scan`` since when each presence is seen free."""
    free_since = {
        lease.lease_owner: _seen_free_since(scan.free_since.get(lease.lease_owner), now_s)
        for lease in leases
        if lease.presence_held is False
    }
    # Tokens no longer held are forgotten: a token is never leased again.
    scan.free_since = free_since
    here = host.identity()
    scan.held = any(not _held_by(here, lease) for lease in leases)
    return [
        lease
        for lease in leases
        if holder_is_dead(lease, _elapsed(free_since.get(lease.lease_owner), now_s), host=host)
    ]


def _held_by(here: HolderIdentity, lease: HeldLease) -> bool:
    """Whether ``lease`` is held by the process ``here`` (its pid and start time, in
    its own process table); ``False`` when that cannot be told."""
    holder = parse_holder(lease.lease_driver)
    return (
        holder is not None
        and here.knows_its_process()
        and here.same_process_table(holder)
        and (holder.pid, holder.start_ticks) == (here.pid, here.start_ticks)
    )


def _elapsed(since_s: float | None, now_s: float) -> float | None:
    return None if since_s is None else now_s - since_s


def _seen_free_since(since_s: float | None, now_s: float) -> float:
    # A time from another clock's origin (two drives on one store, on two
    # clocks) cannot be compared: the presence counts as first seen free now.
    return now_s if since_s is None or since_s > now_s else since_s


async def dead_owners(
    store: LeaseReader, now_at: str, jobs: Jobs, *, now_s: float, host: Host
) -> frozenset[str]:
    """Tokens of dead holders to take over, scanning again when the last scan is old.

    ``now_s``: the drive clock's monotonic seconds."""
    scan = store.orphan_scans.of(jobs)
    last = scan.scanned_at
    if _stale(last, now_s, SCAN_INTERVAL_S):
        scan.scanned_at = now_s
        leases = await store.held_leases(now_at, jobs)
        _remember(scan, leases, host, now_s)
    return frozenset(scan.dead)


def _stale(scanned_at: float | None, now_s: float, every_s: float) -> bool:
    # A scan "from the future" was timed on another clock: it is old too.
    return scanned_at is None or not 0 <= now_s - scanned_at < every_s


def _remember(scan: _Scan, leases: list[HeldLease], host: Host, now_s: float) -> None:
    found = _judge(leases, host, scan, now_s)
    scan.dead = {lease.lease_owner: lease.run_id for lease in found}


def look_due(store: LeaseReader, jobs: Jobs, now_s: float) -> bool:
    """Whether an idle worker should read ``jobs``' held leases on ``store`` again now
    (never read, or last read ``IDLE_LOOK_S`` ago or more, by a look or a claim).
    Marks the look as taken: a second driver asking meanwhile is told no."""
    scan = store.orphan_scans.of(jobs)
    if not _stale(scan.scanned_at, now_s, IDLE_LOOK_S):
        return False
    scan.scanned_at = now_s
    return True


def judge_leases(
    store: LeaseReader, jobs: Jobs, leases: list[HeldLease], *, now_s: float, host: Host
) -> frozenset[str]:
    """An idle worker's look: ``leases`` (``held_leases`` of ``jobs``, read at the
    drive clock's ``now_s``) judged and remembered as a scan, which the next claim
    within ``SCAN_INTERVAL_S`` acts on. The tokens of the holders proven dead."""
    scan = store.orphan_scans.of(jobs)
    scan.scanned_at = now_s
    _remember(scan, leases, host, now_s)
    return frozenset(scan.dead)


def look_again_in_s(
    store: LeaseReader,
    jobs: Jobs,
    now_s: float,
    every_s: float = IDLE_LOOK_S,
    *,
    owed: bool = False,
) -> float | None:
    """How long an idle driver of ``jobs`` may wait before it looks at ``store``'s
    held leases again: until the last scan is ``every_s`` old (0: now) while that
    scan saw a lease of another process, or while a look is ``owed`` (the driver
    found live runs, none due, and its look was refused as too soon: the last scan
    may predate a lease taken since, as when a peer wins the claim a NOTIFY woke
    both to); ``None`` otherwise (nothing that can die; a new lease comes with a
    write, a NOTIFY or a due instant that wakes the driver anyway)."""
    scan = store.orphan_scans.get(jobs)
    if scan is None or scan.scanned_at is None:
        return None
    if not (owed or scan.held or scan.dead):
        return None
    return max(0.0, min(every_s, scan.scanned_at + every_s - now_s))


def suspects(store: LeaseReader) -> bool:
    """Whether a scan on ``store`` saw a presence free that is not proven dead yet."""
    return any(token not in scan.dead for scan in store.orphan_scans for token in scan.free_since)


def dead_known(store: LeaseReader, jobs: Jobs) -> bool:
    """Whether the last scan of ``jobs`` on ``store`` proved a holder dead whose run
    no claim of this process has taken yet."""
    scan = store.orphan_scans.get(jobs)
    return scan is not None and bool(scan.dead)


def claimed(store: LeaseReader, jobs: Jobs, run_id: str) -> None:
    """A run was claimed: it is nobody's orphan any more."""
    scan = store.orphan_scans.get(jobs)
    if scan is not None and scan.dead:
        scan.dead = {token: held for token, held in scan.dead.items() if held != run_id}
