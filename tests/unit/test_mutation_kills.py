"""Promises that mutation testing found unguarded (issue 17, item 2; see tests/README.md).

Each test here kills mutants that survived the rest of the fast suite: it states a
behaviour the code must keep, not how the code is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobrun
from jobrun._core import stranded
from jobrun._core.formats import MalformedColumnError, decode_json
from jobrun._core.holders import HolderIdentity, died_on_this_host, local_identity, parse_holder
from jobrun._core.lease import Lease, LeaseKeeper
from jobrun._core.records import HeldLease
from jobrun._system import SYSTEM_CLOCK
from jobrun.errors import LeaseLostError
from jobrun.testing import FakeClock, MemoryJobRunStore

# --- holders: the identity a claim stores, and proof of death -----------------------------------


def test_a_described_identity_parses_back_field_for_field() -> None:
    identity = HolderIdentity(
        host="web-7",
        boot="5c1d-e9",
        pid_namespace="4026531836",
        pid=4121,
        start_ticks=8934,
        presence=77,
    )
    text = identity.describe("worker-1/3")
    assert text == (
        "worker-1/3 [jobrun host=web-7 boot=5c1d-e9 pidns=4026531836 pid=4121 start=8934 "
        "presence=77]"
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


def _here() -> HolderIdentity:
    if not Path("/proc/self/stat").exists():
        pytest.skip("this host has no /proc to prove a death with")
    here = local_identity()
    # With /proc every field is learnt: a missing one would make every death unprovable.
    assert None not in (here.boot, here.pid_namespace, here.start_ticks), here
    return here


def test_this_process_knows_its_own_identity() -> None:
    here = _here()
    stat = Path("/proc/self/stat").read_text(encoding="ascii")
    assert here.pid == os.getpid()
    assert here.start_ticks == int(stat.rsplit(")", 1)[1].split()[19])
    assert here.host == os.uname().nodename
    assert here.pid_namespace == os.readlink("/proc/self/ns/pid")[len("pid:[") : -1]
    assert here.boot == Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    assert local_identity() is here, "learnt once per process"


@pytest.mark.parametrize(
    ("boot", "pid_namespace"),
    [(None, None), ("other", None), (None, "other"), ("other", "same"), ("same", "other")],
)
def test_a_holder_in_another_process_table_is_never_proven_dead(
    boot: str | None, pid_namespace: str | None
) -> None:
    here = _here()
    holder = HolderIdentity(
        host="x",
        boot=here.boot if boot == "same" else boot,
        pid_namespace=here.pid_namespace if pid_namespace == "same" else pid_namespace,
        pid=_unused_pid(),
        start_ticks=1,
    )
    assert not died_on_this_host(holder, here)
    assert not holder.same_process_table(here)


def test_a_pid_gone_from_this_host_is_proven_dead() -> None:
    here = _here()
    gone = HolderIdentity(
        host="x", boot=here.boot, pid_namespace=here.pid_namespace, pid=_unused_pid(), start_ticks=1
    )
    assert died_on_this_host(gone, here)
    assert died_on_this_host(gone) is True, "compared with this process by default"


@pytest.mark.parametrize("missing", ["pid", "start_ticks"])
def test_a_holder_without_pid_or_start_proves_nothing(missing: str) -> None:
    here = _here()
    fields = {"pid": _unused_pid(), "start_ticks": 1, missing: None}
    holder = HolderIdentity(host="x", boot=here.boot, pid_namespace=here.pid_namespace, **fields)
    assert not died_on_this_host(holder, here)


def test_a_live_process_is_dead_only_when_its_pid_was_reused() -> None:
    here = _here()
    assert not died_on_this_host(here, here), "this very process is alive"
    assert here.start_ticks is not None
    reused = HolderIdentity(
        host=here.host,
        boot=here.boot,
        pid_namespace=here.pid_namespace,
        pid=here.pid,
        start_ticks=here.start_ticks + 1,
    )
    assert died_on_this_host(reused, here), "same pid, another start: the holder is gone"


def test_a_zombie_holder_is_proven_dead(zombie: int) -> None:
    here = _here()
    stat = Path(f"/proc/{zombie}/stat").read_text(encoding="ascii")
    start = int(stat.rsplit(")", 1)[1].split()[19])
    holder = HolderIdentity(
        host="x", boot=here.boot, pid_namespace=here.pid_namespace, pid=zombie, start_ticks=start
    )
    assert died_on_this_host(holder, here)


def _unused_pid() -> int:
    limit = int(Path("/proc/sys/kernel/pid_max").read_text(encoding="ascii"))
    for pid in range(limit - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            continue
    raise AssertionError("no free pid")


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited but that its parent (this test) has not reaped yet."""
    child = subprocess.Popen(["true"])
    try:
        for _ in range(1000):
            state = Path(f"/proc/{child.pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1]
            if state.split()[0] == "Z":
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the child never exited")
        yield child.pid
    finally:
        child.wait()


# --- stranded: runs of dead holders, found by a scan at most once a second ------------------------


class _HeldLeases:
    """Only the read ``dead_owners`` makes, counted."""

    def __init__(self, leases: list[HeldLease]) -> None:
        self.leases = leases
        self.reads: list[tuple[str, Any]] = []

    async def held_leases(self, now_at: str, jobs: Any) -> list[HeldLease]:
        self.reads.append((now_at, jobs))
        return list(self.leases)


def _held(run_id: str, token: str, driver: str | None, presence: bool | None = None) -> HeldLease:
    return HeldLease(run_id, "m", "j", token, driver, "2026-01-01T00:00:00.000Z", presence)


def _dead_driver() -> str:
    here = _here()
    return HolderIdentity(
        host="x", boot=here.boot, pid_namespace=here.pid_namespace, pid=_unused_pid(), start_ticks=1
    ).describe("dead")


def test_a_holder_is_dead_on_proof_only() -> None:
    assert stranded.holder_is_dead(_held("r", "T", None, presence=False)), "presence ended"
    assert not stranded.holder_is_dead(_held("r", "T", None, presence=True))
    assert not stranded.holder_is_dead(_held("r", "T", None, presence=None))
    assert not stranded.holder_is_dead(_held("r", "T", "worker-1", presence=None))
    assert not stranded.holder_is_dead(_held("r", "T", local_identity().describe("me")))
    assert stranded.holder_is_dead(_held("r", "T", _dead_driver()))


async def test_dead_owners_scans_at_most_once_an_interval_and_forgets_claimed_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(stranded.time, "monotonic", lambda: now[0])
    store = _HeldLeases(
        [
            _held("run-dead", "DEAD", _dead_driver()),
            _held("run-gone", "GONE", None, presence=False),
            _held("run-live", "LIVE", local_identity().describe("me")),
        ]
    )
    jobs = frozenset({("m", "j")})
    at = "2026-01-01T00:00:01.000Z"
    assert await stranded.dead_owners(store, at, jobs) == {"DEAD", "GONE"}  # type: ignore[arg-type]
    assert store.reads == [(at, jobs)]
    store.leases = []
    now[0] += stranded.SCAN_INTERVAL_S / 2
    # Within the interval: no read, the last scan stands.
    assert await stranded.dead_owners(store, at, jobs) == {"DEAD", "GONE"}  # type: ignore[arg-type]
    assert len(store.reads) == 1
    # A claim of one of them drops only that one (for these jobs only).
    stranded.claimed(store, frozenset({("m", "other")}), "run-dead")  # type: ignore[arg-type]
    stranded.claimed(store, jobs, "run-dead")  # type: ignore[arg-type]
    # A store never scanned: a claim there is nothing to forget.
    stranded.claimed(_HeldLeases([]), jobs, "run-dead")  # type: ignore[arg-type]
    assert await stranded.dead_owners(store, at, jobs) == {"GONE"}  # type: ignore[arg-type]
    # Another set of jobs has its own scan.
    assert await stranded.dead_owners(store, at, frozenset({("m", "x")})) == frozenset()  # type: ignore[arg-type]
    assert len(store.reads) == 2
    # Exactly one interval later: scanned again.
    now[0] += stranded.SCAN_INTERVAL_S / 2
    assert await stranded.dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    assert len(store.reads) == 3


# --- formats: a refused JSON token is named in the error --------------------------------------


@pytest.mark.parametrize(("text", "token"), [("[1,NaN]", "NaN"), ('{"a":1e999}', "1e999")])
def test_a_non_finite_json_number_is_named_in_the_error(text: str, token: str) -> None:
    with pytest.raises(MalformedColumnError, match=f"cursor is not valid JSON: {token} "):
        decode_json(text, "cursor")


# --- lease keeper: losing the lease stops this pass once, and nothing after it --------------------


async def _extended(expires_at: str) -> bool:
    return True


def _keeper() -> LeaseKeeper:
    return LeaseKeeper(Lease("T", "d", 60_000), SYSTEM_CLOCK, _extended, "run-1")


async def test_losing_the_lease_twice_still_ends_the_pass_as_lost_not_cancelled() -> None:
    keeper = _keeper()
    reached: list[str] = []

    async def pass_that_loses_twice() -> None:
        async with keeper:
            keeper.lose()
            keeper.lose()
            await asyncio.sleep(0)
            reached.append("after the loss")

    with pytest.raises(LeaseLostError) as caught:
        await pass_that_loses_twice()
    assert reached == [], "the pass went on past its next await"
    # The traceback says why the pass was cancelled.
    cause = caught.value.__cause__
    assert isinstance(cause, asyncio.CancelledError)
    assert cause.args == ("jobrun: the lease of this pass was lost",)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_pass_begun_under_a_pending_cancellation_still_ends_as_lost() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    # Caught, not uncancelled: the task carries one cancellation from before the pass.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    assert task.cancelling() == 1
    keeper = _keeper()

    async def losing_pass() -> None:
        async with keeper:
            keeper.lose()
            await asyncio.sleep(0)

    try:
        with pytest.raises(LeaseLostError):
            await losing_pass()
        assert task.cancelling() == 1, "the keeper took back only its own cancellation"
    finally:
        task.uncancel()


async def test_a_failed_renewal_is_retried_at_the_next_interval() -> None:
    calls: list[str] = []

    async def flaky_extend(expires_at: str) -> bool:
        calls.append(expires_at)
        if len(calls) == 1:
            raise OSError("database unreachable for a moment")
        return True

    clock = FakeClock(autojump=True)
    # A 1 s lease renews every 250 ms of the (virtual) clock.
    async with LeaseKeeper(Lease("T", "d", 1000), clock, flaky_extend, "run-1") as keeper:
        await clock.sleep(1.1)
    assert not keeper.lost
    assert calls == [
        "2026-01-01T00:00:01.250Z",
        "2026-01-01T00:00:01.500Z",
        "2026-01-01T00:00:01.750Z",
        "2026-01-01T00:00:02.000Z",
    ]


async def test_losing_the_lease_after_the_pass_ended_cancels_nothing() -> None:
    keeper = _keeper()
    async with keeper:
        pass
    keeper.lose()
    # The driver's task goes on: a cancellation here would raise CancelledError.
    await asyncio.sleep(0)
    assert keeper.lost


# --- operator reads and queue-safety: errors say what was wrong -----------------------------------


@pytest.mark.parametrize("limit", ["5", [5], True])
async def test_a_list_limit_that_is_no_number_is_named_by_its_type(limit: object) -> None:
    with pytest.raises(
        TypeError, match=f"^limit must be a number or None, got {type(limit).__name__}$"
    ):
        await jobrun.job_runs(MemoryJobRunStore(), limit=limit)  # type: ignore[arg-type]


async def test_a_run_id_that_is_no_str_is_named_by_its_type() -> None:
    with pytest.raises(TypeError, match=r"^run_id must be a str, got int$"):
        await jobrun.get_job_run(MemoryJobRunStore(), 5)  # type: ignore[arg-type]


class _Holder:
    def method(self) -> None:
        return None


@pytest.mark.parametrize("function", [len, lambda: None, _Holder().method, [].append])
def test_every_kind_of_function_is_called_a_function(function: object) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.assert_queue_safe({"f": function}, "payload")
    assert caught.value.errors == [
        {"path": "payload.f", "message": "a function cannot be stored and read back unchanged"}
    ]


async def test_an_unknown_status_filter_lists_the_statuses() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.job_runs(MemoryJobRunStore(), status="paused")
    assert str(caught.value) == "status filter 'paused' is not one of running, done, failed"
    assert caught.value.errors == [{"path": "status", "message": "'paused' is not a run status"}]


@pytest.mark.parametrize("argument", ["module_id", "job", "instance"])
async def test_a_key_filter_that_is_no_str_is_named_with_its_type(argument: str) -> None:
    with pytest.raises(TypeError, match=f"^{argument} filter must be a str or None, got int$"):
        await jobrun.job_runs(MemoryJobRunStore(), **{argument: 5})  # type: ignore[arg-type]


def test_a_refusal_says_what_a_run_carries() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.assert_queue_safe({"blob": b"x"}, "payload")
    assert str(caught.value) == (
        "payload is not queue-safe: payload.blob is a bytes; a run carries ids and "
        "configuration, not bytes, objects or functions"
    )
