"""The orphan scan: which holders are proven dead, and how often it reads."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from jobrun._core.leases import proof_of_death as orphans
from jobrun._core.model.records import HeldLease
from jobrun._host.system import THIS_HOST, local_identity
from tests.support import dead_driver


class _HeldLeases:
    """Only the read ``dead_owners`` makes, counted."""

    def __init__(self, leases: list[HeldLease]) -> None:
        self.leases = leases
        self.reads: list[tuple[str, Any]] = []
        self.orphan_scans = orphans.OrphanScans()

    async def held_leases(self, now_at: str, jobs: Any) -> list[HeldLease]:
        self.reads.append((now_at, jobs))
        return list(self.leases)


def _held(run_id: str, token: str, driver: str | None, presence: bool | None = None) -> HeldLease:
    return HeldLease(run_id, "m", "j", token, driver, "2026-01-01T00:00:00.000Z", presence)


def test_a_holder_is_dead_on_proof_only() -> None:
    grace = orphans.PRESENCE_GRACE_S
    holder_is_dead = functools.partial(orphans.holder_is_dead, host=THIS_HOST)
    # A presence seen free proves death only once the grace period has passed.
    assert not holder_is_dead(_held("r", "T", None, presence=False))
    assert not holder_is_dead(_held("r", "T", None, presence=False), grace - 0.001)
    assert holder_is_dead(_held("r", "T", None, presence=False), grace)
    assert not holder_is_dead(_held("r", "T", None, presence=True), grace * 10)
    assert not holder_is_dead(_held("r", "T", None, presence=None))
    assert not holder_is_dead(_held("r", "T", "worker-1", presence=None))
    assert not holder_is_dead(_held("r", "T", local_identity().describe("me")))
    # A process gone from this host is dead at once, with or without a presence...
    assert holder_is_dead(_held("r", "T", dead_driver()))
    assert holder_is_dead(_held("r", "T", dead_driver(), presence=False))
    # ...but a held presence is proof of life, whatever /proc suggests.
    assert not holder_is_dead(_held("r", "T", dead_driver(), presence=True))


def _dead_owners_at(now: list[float]) -> Any:
    """``orphans.dead_owners`` on this host, at the drive clock's time ``now[0]``."""
    return lambda store, at, jobs: orphans.dead_owners(
        store, at, jobs, now_s=now[0], host=THIS_HOST
    )


async def test_dead_owners_scans_at_most_once_an_interval_and_forgets_claimed_runs() -> None:
    now = [1000.0]
    dead_owners = _dead_owners_at(now)
    store = _HeldLeases(
        [
            _held("run-dead", "DEAD", dead_driver()),
            _held("run-gone", "GONE", None, presence=False),
            _held("run-live", "LIVE", local_identity().describe("me")),
        ]
    )
    jobs = frozenset({("m", "j")})
    at = "2026-01-01T00:00:01.000Z"
    # The free presence is a suspect, not yet dead: only the process gone from here is.
    assert await dead_owners(store, at, jobs) == {"DEAD"}  # type: ignore[arg-type]
    assert orphans.suspects(store)  # type: ignore[arg-type]
    assert store.reads == [(at, jobs)]
    now[0] += orphans.SCAN_INTERVAL_S / 2
    # Within the interval: no read, the last scan stands.
    assert await dead_owners(store, at, jobs) == {"DEAD"}  # type: ignore[arg-type]
    assert len(store.reads) == 1
    # Once the presence has been seen free for the grace period, it is dead too.
    now[0] += orphans.PRESENCE_GRACE_S
    assert await dead_owners(store, at, jobs) == {"DEAD", "GONE"}  # type: ignore[arg-type]
    assert not orphans.suspects(store)  # type: ignore[arg-type]
    assert len(store.reads) == 2
    store.leases = []
    # A claim of one of them drops only that one (for these jobs only).
    orphans.claimed(store, frozenset({("m", "other")}), "run-dead")  # type: ignore[arg-type]
    orphans.claimed(store, jobs, "run-dead")  # type: ignore[arg-type]
    # A store never scanned: a claim there is nothing to forget.
    orphans.claimed(_HeldLeases([]), jobs, "run-dead")  # type: ignore[arg-type]
    assert await dead_owners(store, at, jobs) == {"GONE"}  # type: ignore[arg-type]
    # Another set of jobs has its own scan.
    assert await dead_owners(store, at, frozenset({("m", "x")})) == frozenset()  # type: ignore[arg-type]
    assert len(store.reads) == 3
    # Exactly one interval later: scanned again, and the tokens no longer held forgotten.
    now[0] += orphans.SCAN_INTERVAL_S
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    assert len(store.reads) == 4


async def test_a_presence_seen_free_again_after_a_gap_restarts_its_grace() -> None:
    now = [50.0]
    dead_owners = _dead_owners_at(now)
    store = _HeldLeases([_held("run", "T", None, presence=False)])
    jobs = frozenset({("m", "j")})
    at = "2026-01-01T00:00:01.000Z"
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    # The holder is seen held again (it was the claimer's view that lagged): forgotten.
    store.leases = [_held("run", "T", None, presence=True)]
    now[0] += orphans.SCAN_INTERVAL_S
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    store.leases = [_held("run", "T", None, presence=False)]
    now[0] += orphans.PRESENCE_GRACE_S - 0.5
    # Free for less than the grace since it was seen free again: not dead.
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    now[0] += orphans.PRESENCE_GRACE_S
    assert await dead_owners(store, at, jobs) == {"T"}  # type: ignore[arg-type]


def test_the_old_name_of_the_scans_warns_and_answers_the_same() -> None:
    from jobrun.testing import MemoryJobRunStore

    store = MemoryJobRunStore()
    with pytest.warns(DeprecationWarning, match="orphan_scans"):
        assert store.stranded_scans is store.orphan_scans


# --- an idle worker's looks (jobrun.worker.deaths): when to look again -------------------------


async def test_an_idle_look_is_taken_at_most_once_an_interval_and_stands_as_the_claims_scan() -> (
    None
):
    now = [100.0]
    store = _HeldLeases([])
    jobs = frozenset({("m", "j")})
    assert orphans.look_due(store, jobs, now[0])  # type: ignore[arg-type]
    # Taken: a second driver asking at the same moment is told no.
    assert not orphans.look_due(store, jobs, now[0])  # type: ignore[arg-type]
    leases = [_held("run-dead", "DEAD", dead_driver())]
    judged = orphans.judge_leases(store, jobs, leases, now_s=now[0], host=THIS_HOST)  # type: ignore[arg-type]
    assert judged == {"DEAD"}
    assert orphans.dead_known(store, jobs)  # type: ignore[arg-type]
    assert not orphans.dead_known(store, frozenset({("m", "other")}))  # type: ignore[arg-type]
    now[0] += orphans.IDLE_LOOK_S / 2
    assert not orphans.look_due(store, jobs, now[0])  # type: ignore[arg-type]
    # The claim right after acts on the look's proof, without a read of its own.
    at = "2026-01-01T00:00:01.000Z"
    assert await _dead_owners_at(now)(store, at, jobs) == {"DEAD"}
    assert store.reads == []
    orphans.claimed(store, jobs, "run-dead")  # type: ignore[arg-type]
    assert not orphans.dead_known(store, jobs)  # type: ignore[arg-type]
    now[0] += orphans.IDLE_LOOK_S / 2
    assert orphans.look_due(store, jobs, now[0])  # type: ignore[arg-type]
    # A look "from the future" (timed on another clock) is old too.
    assert orphans.look_due(store, jobs, now[0] - 50)  # type: ignore[arg-type]


def test_an_idle_driver_looks_again_at_its_next_death_check_only_while_a_peer_holds_a_lease() -> (
    None
):
    store = _HeldLeases([])
    jobs = frozenset({("m", "j")})
    look_again_in_s = orphans.look_again_in_s
    # Never looked: nothing known to wait for (the first look comes with the first probe).
    assert look_again_in_s(store, jobs, 10.0) is None  # type: ignore[arg-type]
    # A peer's live lease (a held presence: proof of life): look again IDLE_LOOK_S later.
    peer = [_held("run", "PEER", None, presence=True)]
    orphans.judge_leases(store, jobs, peer, now_s=10.0, host=THIS_HOST)  # type: ignore[arg-type]
    assert look_again_in_s(store, jobs, 10.0) == orphans.IDLE_LOOK_S  # type: ignore[arg-type]
    assert look_again_in_s(store, jobs, 10.2) == pytest.approx(0.3)  # type: ignore[arg-type]
    assert look_again_in_s(store, jobs, 11.0) == 0.0  # type: ignore[arg-type]
    # Timed on another clock: never longer than the interval.
    assert look_again_in_s(store, jobs, 5.0) == orphans.IDLE_LOOK_S  # type: ignore[arg-type]
    # The polling worker's claims rescan every SCAN_INTERVAL_S: it waits for that.
    every = orphans.SCAN_INTERVAL_S
    assert look_again_in_s(store, jobs, 10.25, every) == pytest.approx(every - 0.25)  # type: ignore[arg-type]
    # Only this process's own lease: it ends with us, nothing to look for.
    ours = [_held("run", "OURS", local_identity().describe("me"))]
    orphans.judge_leases(store, jobs, ours, now_s=12.0, host=THIS_HOST)  # type: ignore[arg-type]
    assert look_again_in_s(store, jobs, 12.0) is None  # type: ignore[arg-type]
    # No lease at all: the same...
    orphans.judge_leases(store, jobs, [], now_s=13.0, host=THIS_HOST)  # type: ignore[arg-type]
    assert look_again_in_s(store, jobs, 13.0) is None  # type: ignore[arg-type]
    # ...unless a look is owed: live runs found none due, the look refused as too soon
    # (a peer may have won, since that last look, the claim a NOTIFY woke both to).
    assert look_again_in_s(store, jobs, 13.1, owed=True) == pytest.approx(0.4)  # type: ignore[arg-type]


def test_looks_every_idle_interval_prove_a_free_presence_dead_exactly_at_the_grace() -> None:
    store = _HeldLeases([])
    jobs = frozenset({("m", "j")})
    gone = [_held("run", "GONE", None, presence=False)]
    looks = round(orphans.PRESENCE_GRACE_S / orphans.IDLE_LOOK_S)
    # First seen free at 0: a suspect at every look before the grace has passed...
    for number in range(looks):
        now_s = number * orphans.IDLE_LOOK_S
        assert orphans.look_due(store, jobs, now_s)  # type: ignore[arg-type]
        found = orphans.judge_leases(store, jobs, gone, now_s=now_s, host=THIS_HOST)  # type: ignore[arg-type]
        assert found == frozenset()
        assert orphans.look_again_in_s(store, jobs, now_s) == orphans.IDLE_LOOK_S  # type: ignore[arg-type]
    # ...and dead at the first look once it has: G after the first sight, not G + 1 s.
    now_s = looks * orphans.IDLE_LOOK_S
    assert orphans.look_due(store, jobs, now_s)  # type: ignore[arg-type]
    assert orphans.judge_leases(store, jobs, gone, now_s=now_s, host=THIS_HOST) == {"GONE"}  # type: ignore[arg-type]
