"""Promises that mutation testing found unguarded (issue 17, item 2; see tests/README.md).

Each test here kills mutants that survived the rest of the fast suite: it states a
behaviour the code must keep, not how the code is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core import stranded
from jobrun._core.browse import RunQuery
from jobrun._core.clock import as_clock
from jobrun._core.dbclock import aligned_clock
from jobrun._core.formats import MalformedColumnError, decode_json
from jobrun._core.holders import HolderIdentity, Liveness, parse_holder
from jobrun._core.lease import Lease, LeaseKeeper
from jobrun._core.observe import PassEnd, PassStart
from jobrun._core.outcomes import MAX_ERROR_TEXT_BYTES, cap_error_text
from jobrun._core.port import StoreLimits
from jobrun._core.progress import Poll, progress_of, span
from jobrun._core.records import (
    JOB_RUN_LIST_MAX,
    ClaimRequest,
    HeldLease,
    RunFilter,
    RunKey,
    StepRow,
)
from jobrun._core.retention import RETENTION_BATCH, check_prune_after, prune_by_retention
from jobrun._core.transitions import cancel_transition, release_transition, resume_transition
from jobrun._entry import SYSTEM_SOURCES
from jobrun._system import SYSTEM_CLOCK, THIS_HOST, liveness_on_this_host, local_identity
from jobrun.errors import LeaseLostError
from jobrun.sql.store import _prefix_successor
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import SQL_BACKENDS, claim_as, proc_identity, unused_pid

# --- holders: the identity a claim stores, and proof of death -----------------------------------


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


def test_this_process_knows_its_own_identity() -> None:
    here = proc_identity()
    stat = Path("/proc/self/stat").read_text(encoding="ascii")
    assert here.pid == os.getpid()
    assert here.start_ticks == int(stat.rsplit(")", 1)[1].split()[19])
    assert here.host == os.uname().nodename
    assert here.pid_namespace == os.readlink("/proc/self/ns/pid")[len("pid:[") : -1]
    if Path("/proc/self/ns/time").exists():
        assert here.time_namespace == os.readlink("/proc/self/ns/time")[len("time:[") : -1]
    assert here.boot == Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    assert local_identity() is here, "learnt once per process"


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


# --- stranded: runs of dead holders, found by a scan at most once a second ------------------------


class _HeldLeases:
    """Only the read ``dead_owners`` makes, counted."""

    def __init__(self, leases: list[HeldLease]) -> None:
        self.leases = leases
        self.reads: list[tuple[str, Any]] = []
        self.stranded_scans = stranded.StrandedScans()

    async def held_leases(self, now_at: str, jobs: Any) -> list[HeldLease]:
        self.reads.append((now_at, jobs))
        return list(self.leases)


def _held(run_id: str, token: str, driver: str | None, presence: bool | None = None) -> HeldLease:
    return HeldLease(run_id, "m", "j", token, driver, "2026-01-01T00:00:00.000Z", presence)


def _dead_driver() -> str:
    return replace(proc_identity(), host="x", pid=unused_pid(), start_ticks=1).describe("dead")


def test_a_holder_is_dead_on_proof_only() -> None:
    grace = stranded.PRESENCE_GRACE_S
    holder_is_dead = functools.partial(stranded.holder_is_dead, host=THIS_HOST)
    # A presence seen free proves death only once the grace period has passed.
    assert not holder_is_dead(_held("r", "T", None, presence=False))
    assert not holder_is_dead(_held("r", "T", None, presence=False), grace - 0.001)
    assert holder_is_dead(_held("r", "T", None, presence=False), grace)
    assert not holder_is_dead(_held("r", "T", None, presence=True), grace * 10)
    assert not holder_is_dead(_held("r", "T", None, presence=None))
    assert not holder_is_dead(_held("r", "T", "worker-1", presence=None))
    assert not holder_is_dead(_held("r", "T", local_identity().describe("me")))
    # A process gone from this host is dead at once, with or without a presence...
    assert holder_is_dead(_held("r", "T", _dead_driver()))
    assert holder_is_dead(_held("r", "T", _dead_driver(), presence=False))
    # ...but a held presence is proof of life, whatever /proc suggests.
    assert not holder_is_dead(_held("r", "T", _dead_driver(), presence=True))


def _dead_owners_at(now: list[float]) -> Any:
    """``stranded.dead_owners`` on this host, at the drive clock's time ``now[0]``."""
    return lambda store, at, jobs: stranded.dead_owners(
        store, at, jobs, now_s=now[0], host=THIS_HOST
    )


async def test_dead_owners_scans_at_most_once_an_interval_and_forgets_claimed_runs() -> None:
    now = [1000.0]
    dead_owners = _dead_owners_at(now)
    store = _HeldLeases(
        [
            _held("run-dead", "DEAD", _dead_driver()),
            _held("run-gone", "GONE", None, presence=False),
            _held("run-live", "LIVE", local_identity().describe("me")),
        ]
    )
    jobs = frozenset({("m", "j")})
    at = "2026-01-01T00:00:01.000Z"
    # The free presence is a suspect, not yet dead: only the process gone from here is.
    assert await dead_owners(store, at, jobs) == {"DEAD"}  # type: ignore[arg-type]
    assert stranded.suspects(store)  # type: ignore[arg-type]
    assert store.reads == [(at, jobs)]
    now[0] += stranded.SCAN_INTERVAL_S / 2
    # Within the interval: no read, the last scan stands.
    assert await dead_owners(store, at, jobs) == {"DEAD"}  # type: ignore[arg-type]
    assert len(store.reads) == 1
    # Once the presence has been seen free for the grace period, it is dead too.
    now[0] += stranded.PRESENCE_GRACE_S
    assert await dead_owners(store, at, jobs) == {"DEAD", "GONE"}  # type: ignore[arg-type]
    assert not stranded.suspects(store)  # type: ignore[arg-type]
    assert len(store.reads) == 2
    store.leases = []
    # A claim of one of them drops only that one (for these jobs only).
    stranded.claimed(store, frozenset({("m", "other")}), "run-dead")  # type: ignore[arg-type]
    stranded.claimed(store, jobs, "run-dead")  # type: ignore[arg-type]
    # A store never scanned: a claim there is nothing to forget.
    stranded.claimed(_HeldLeases([]), jobs, "run-dead")  # type: ignore[arg-type]
    assert await dead_owners(store, at, jobs) == {"GONE"}  # type: ignore[arg-type]
    # Another set of jobs has its own scan.
    assert await dead_owners(store, at, frozenset({("m", "x")})) == frozenset()  # type: ignore[arg-type]
    assert len(store.reads) == 3
    # Exactly one interval later: scanned again, and the tokens no longer held forgotten.
    now[0] += stranded.SCAN_INTERVAL_S
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
    now[0] += stranded.SCAN_INTERVAL_S
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    store.leases = [_held("run", "T", None, presence=False)]
    now[0] += stranded.PRESENCE_GRACE_S - 0.5
    # Free for less than the grace since it was seen free again: not dead.
    assert await dead_owners(store, at, jobs) == frozenset()  # type: ignore[arg-type]
    now[0] += stranded.PRESENCE_GRACE_S
    assert await dead_owners(store, at, jobs) == {"T"}  # type: ignore[arg-type]


# --- formats: a refused JSON token is named in the error --------------------------------------


@pytest.mark.parametrize(("text", "token"), [("[1,NaN]", "NaN"), ('{"a":1e999}', "1e999")])
def test_a_non_finite_json_number_is_named_in_the_error(text: str, token: str) -> None:
    with pytest.raises(MalformedColumnError, match=f"cursor is not valid JSON: {token} "):
        decode_json(text, "cursor")


# --- lease keeper: losing the lease stops this pass once, and nothing after it --------------------


async def _extended(expires_at: str, now_at: str) -> bool:
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
            # sleep: a suspension point inside the lost pass
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
        # sleep: a suspension point where the pending cancellation lands
        await asyncio.sleep(0)
    assert task.cancelling() == 1
    keeper = _keeper()

    async def losing_pass() -> None:
        async with keeper:
            keeper.lose()
            # sleep: a suspension point inside the lost pass
            await asyncio.sleep(0)

    try:
        with pytest.raises(LeaseLostError):
            await losing_pass()
        assert task.cancelling() == 1, "the keeper took back only its own cancellation"
    finally:
        task.uncancel()


async def test_a_failed_renewal_is_retried_at_the_next_interval() -> None:
    calls: list[str] = []

    async def flaky_extend(expires_at: str, now_at: str) -> bool:
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


# --- passes: what the handler is told, and what a pass writes -------------------------------------


def test_an_error_text_of_exactly_the_cap_is_kept_whole_and_one_byte_more_is_cut() -> None:
    whole = "x" * MAX_ERROR_TEXT_BYTES
    assert cap_error_text(whole) == whole
    # 64 bytes are kept free for the note saying how much was cut.
    assert cap_error_text(whole + "y") == "x" * (MAX_ERROR_TEXT_BYTES - 64) + (
        " [... cut, 65 more bytes]"
    )


def _write_counter(p: jobrun.JobPass) -> None:
    cast(Any, p.counters)["rows"] = 5


def _delete_counter(p: jobrun.JobPass) -> None:
    del cast(Any, p.counters)["rows"]


def _count_with_a_bad_name(p: jobrun.JobPass) -> None:
    p.count(cast(Any, 5))


async def test_misusing_p_counters_is_a_mistake_about_the_counters() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    seen: dict[str, Any] = {}
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("rows", 2)
        seen["shown"] = repr(p.counters)
        seen["errors"] = []
        for misuse in (_write_counter, _delete_counter, _count_with_a_bad_name):
            with pytest.raises(jobrun.HandlerMistakeError) as caught:
                misuse(p)
            seen["errors"].append((caught.value.errors, str(caught.value)))
        return jobrun.PassResult(done=True)

    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).completed == 1
    assert seen["shown"] == "{'rows': 2}"
    assert [errors for errors, _ in seen["errors"]] == [
        [{"path": "counters", "message": text}] for _, text in seen["errors"]
    ]
    assert ["read-only" in text for _, text in seen["errors"]] == [True, True, False]
    assert "use a str" in seen["errors"][2][1]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.counters == {"rows": 2}, "a refused write changed nothing"


def test_the_keep_cursor_marker_reads_as_its_name() -> None:
    assert repr(jobrun.KEEP_CURSOR) == "KEEP_CURSOR"


class _Ends:
    """An observer that keeps every pass's start and end."""

    def __init__(self) -> None:
        self.starts: list[PassStart] = []
        self.ends: list[PassEnd] = []

    def pass_started(self, start: PassStart) -> _Ends:
        self.starts.append(start)
        return self

    def step_started(self, name: str) -> None:
        return None

    def step_ended(self, end: object) -> None:
        return None

    def pass_ended(self, end: PassEnd) -> None:
        self.ends.append(end)


async def test_a_failure_the_store_refuses_after_a_cancel_is_heard_as_superseded(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await jobrun.cancel_job_run(store, p.run.id, "stop it", clock=clock)
        raise RuntimeError("after the cancel")

    observer = _Ends()
    report = await jobrun.run_due_jobs(store, registry, clock=clock, observer=observer)
    assert (report.superseded, report.failed, report.retrying) == (1, 0, 0)
    assert [(end.outcome, end.error) for end in observer.ends] == [
        ("superseded", "RuntimeError: after the cancel")
    ]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.last_error == "cancelled: stop it", "the refused failure wrote nothing"


async def test_a_run_failed_for_its_takeovers_is_stamped_when_it_failed(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    registry.register("m", "j", _done, lease_ms=1000, max_takeovers=0)
    assert await claim_as(store, clock, "DEAD-0") is not None
    clock.advance(seconds=5)
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).failed == 1
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.updated_at == record.ended_at == clock()


async def _done(p: jobrun.JobPass) -> jobrun.PassResult:
    return jobrun.PassResult(done=True)


# --- names: a refused name is shown, cut when long ------------------------------------------------


async def test_a_long_refused_name_is_shown_cut_after_40_characters() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.start_job_run(MemoryJobRunStore(), module_id="m", job="a" * 600)
    assert str(caught.value) == (
        f"job '{'a' * 40}...' is 600 bytes of UTF-8, over the 512-byte limit for names"
    )
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.start_job_run(MemoryJobRunStore(), module_id="m", job="b" * 39 + "\x00")
    assert str(caught.value).startswith(f"job '{'b' * 39}\\x00' contains a NUL")


# --- operator actions: refusals say what was wrong, health counts dead holders as due -------------


async def test_operator_refusals_say_what_was_wrong(store: Any, clock: FakeClock) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.cancel_job_run(store, "R", "  ", clock=clock)
    assert caught.value.errors == [{"path": "reason", "message": "empty or not a str"}]
    with pytest.raises(jobrun.JobRunNotFoundError) as missing:
        await jobrun.cancel_job_run(store, "NO-SUCH-RUN", "why", clock=clock)
    assert missing.value.run_id == "NO-SUCH-RUN"
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.cancel_job_run(store, run.id, "first", clock=clock)
    with pytest.raises(jobrun.JobConflictError) as conflict:
        await jobrun.cancel_job_run(store, run.id, "again", clock=clock)
    assert str(conflict.value) == f"run {run.id} is failed, not running; nothing to cancel"
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.prune_job_runs(store, older_than=timedelta(days=1), statuses=("running",))
    assert caught.value.errors == [{"path": "statuses", "message": "not prunable: ['running']"}]
    with pytest.raises(TypeError, match=r"^older_than must be a timedelta or datetime, got int$"):
        await jobrun.prune_job_runs(store, older_than=cast(Any, 5))


async def test_health_counts_each_kind_of_run_apart(store: Any, clock: FakeClock) -> None:
    for instance in ("a", "b", "c"):
        await jobrun.start_job_run(store, module_id="m", job="j", instance=instance, clock=clock)
    assert await claim_as(store, clock, "LIVE-HOLDER", driver="alive", lease_ms=60_000)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased, health.failed) == (3, 2, 1, 0)


async def test_a_run_held_by_a_dead_holder_is_due_and_taken_over_at_once(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    dead = _dead_driver()
    assert await claim_as(store, clock, "DEAD-TOKEN", driver=dead, lease_ms=60_000)
    clock.advance(seconds=30)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.due, health.leased) == (1, 0), "a provably dead holder's run waits"
    assert health.oldest_due_age_s == 30.0, "since its pass began"
    registry = jobrun.JobRegistry()
    told: list[str | None] = []

    @registry.job("m", "j", lease_ms=60_000)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        record = await jobrun.get_job_run(store, p.run.id)
        assert record is not None
        told.append(record.last_error)
        return jobrun.PassResult(done=True)

    # The lease has 60 s left: only the proof of death lets this driver take the run.
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert told == [f"the driver {dead} died during a pass; the run was taken over at once"]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "done"


async def test_a_dead_holder_of_a_cancelled_run_leaves_nothing_due(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    assert await claim_as(store, clock, "DEAD-TOKEN", driver=_dead_driver(), lease_ms=60_000)
    await jobrun.cancel_job_run(store, run.id, "stop", clock=clock)
    health = await jobrun.job_run_health(store, clock=clock)
    assert (health.running, health.due, health.leased, health.failed) == (0, 0, 0, 1)


async def test_a_backing_off_run_does_not_count_against_the_limit(
    store: Any, clock: FakeClock
) -> None:
    first = await jobrun.start_job_run(store, module_id="m", job="j", instance="1", clock=clock)
    registry = jobrun.JobRegistry()
    ran: list[str] = []

    @registry.job("m", "j", max_concurrent=1, retry=jobrun.RetryPolicy(base_delay_ms=60_000))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        ran.append(p.run.instance)
        if p.run.id == first.id:
            raise RuntimeError("try later")
        return jobrun.PassResult(done=True)

    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).retrying == 1
    await jobrun.start_job_run(store, module_id="m", job="j", instance="2", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.completed, ran) == (1, ["1", "2"])


# --- the SQL store: operations are named to the statement hook and in errors ----------------------


class _RefusingHook:
    """A statement hook that records the operation, then fails as a lost connection would."""

    def __init__(self) -> None:
        self.operations: list[str] = []

    @contextlib.asynccontextmanager
    async def __call__(self, operation: str, sql: str, parameters: Any) -> AsyncIterator[None]:
        self.operations.append(operation)
        raise OSError("connection lost (injected)")
        yield  # pragma: no cover - never reached: an async generator needs a yield


_NOW = "2026-01-01T00:00:00.000Z"
_LATER = "2026-01-01T00:01:00.000Z"

_CLAIM = ClaimRequest(_NOW, "T", "d", {("m", "j"): _LATER})

# By the operation the hook and the error must name: a call to the store that sends it.
STORE_OPERATIONS: dict[str, tuple[str, Any]] = {
    "get": ("get", lambda store: store.get("R")),
    "claim": ("claim", lambda store: store.claim(_CLAIM)),
    # Postgres orders a limited job's claims with a lock, in a transaction of its own.
    "claim-limited": (
        "claim",
        lambda store: store.claim(replace(_CLAIM, max_concurrent={("m", "j"): 1})),
    ),
    "held_leases": ("held_leases", lambda store: store.held_leases(_NOW, None)),
    "list": ("list", lambda store: store.list(RunFilter())),
    "steps": ("steps", lambda store: store.steps("R")),
    "record_step": (
        "record_step",
        lambda store: store.record_step("R", StepRow("s", "1", 1, None), _NOW, "T"),
    ),
    "extend_lease": ("extend_lease", lambda store: store.extend_lease("R", "T", _LATER, _LATER)),
    "cancel": ("cancel", lambda store: store.cancel("R", cancel_transition("why", _NOW))),
    "resume": ("resume", lambda store: store.resume("R", resume_transition(_NOW))),
    "release": ("release", lambda store: store.release("R", release_transition())),
    "health": ("health", lambda store: store.health(_NOW)),
    "due_by_job": ("due_by_job", lambda store: store.due_by_job(_NOW)),
    "prune": ("prune", lambda store: store.prune(_NOW, ("done",), 10)),
    "schedule_rows": ("schedule_rows", lambda store: store.schedule_rows()),
    "find": ("find", lambda store: store.find(RunQuery())),
    "count": ("count", lambda store: store.count(RunQuery(), 10)),
    "job_loads": ("job_loads", lambda store: store.job_loads(_NOW, _NOW)),
}


@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("call", sorted(STORE_OPERATIONS))
async def test_a_failed_store_operation_is_named_to_the_hook_and_in_the_error(
    engine: AsyncEngine, backend: str, call: str
) -> None:
    operation, send = STORE_OPERATIONS[call]
    hook = _RefusingHook()
    store = jobrun.SqlJobRunStore(engine, statement_hook=hook)
    with pytest.raises(jobrun.StoreError) as caught:
        await send(store)
    assert caught.value.operation == operation
    assert str(caught.value) == f"{operation} failed: OSError: connection lost (injected)"
    # A transaction's failed BEGIN is followed by its ROLLBACK, under the same name.
    assert hook.operations[0] == operation
    assert set(hook.operations) == {operation}


@pytest.mark.parametrize(
    ("prefix", "successor"),
    [
        ("ab", "ac"),
        ("a\U0010ffff", "b"),
        ("a\ud7ff", "a\ue000"),
        ("\U0010ffff\U0010ffff", None),
        ("", None),
    ],
    ids=["last-character", "carry", "over-the-surrogates", "none-above", "empty"],
)
def test_the_successor_of_a_prefix_is_the_least_string_above_its_range(
    prefix: str, successor: str | None
) -> None:
    assert _prefix_successor(prefix) == successor


async def test_a_run_id_that_cannot_be_stored_is_named_as_the_run_id() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.cancel_job_run(MemoryJobRunStore(), "R\x00", "why")
    assert caught.value.errors == [
        {"path": "run_id", "message": "contains a NUL character (Postgres cannot store it)"}
    ]
    assert str(caught.value).startswith("run_id 'R\\x00' contains a NUL")


async def test_a_step_result_that_cannot_be_stored_is_a_mistake_about_that_step() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    caught: list[jobrun.HandlerMistakeError] = []

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        try:
            await p.step("load", lambda: {1, 2})
        except jobrun.HandlerMistakeError as error:
            caught.append(error)
        return jobrun.PassResult(done=True)

    await jobrun.run_due_jobs(store, registry, clock=clock)
    [error] = caught
    assert error.errors == [
        {"path": "step.load", "message": "not JSON (Object of type set is not JSON serializable)"}
    ]
    assert str(error).endswith("the body ran once and is not run again until the run is resumed"), (
        "the text says what happens next"
    )


async def test_a_step_call_refused_before_it_runs_is_a_mistake_about_the_step() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    paths: list[list[str]] = []

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name, retry in (("", None), ("s", cast(Any, 3))):
            try:
                p.step(name, lambda: 1, retry=retry)
            except jobrun.HandlerMistakeError as error:
                paths.append([entry["path"] for entry in error.errors])
        return jobrun.PassResult(done=True)

    await jobrun.run_due_jobs(store, registry, clock=clock)
    assert paths == [["step"], ["step"]]


# --- the driver: a report counts every outcome, a claim leases each job for its own time ----------


async def test_a_report_counts_each_failed_run(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(max_attempts=1))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise RuntimeError(p.run.instance)

    for instance in ("a", "b"):
        await jobrun.start_job_run(store, module_id="m", job="j", instance=instance, clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.failed) == (2, 2)
    assert sorted(error.error for error in report.errors) == ["RuntimeError: a", "RuntimeError: b"]


async def test_each_job_is_leased_for_its_own_lease_time(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()
    expiries: dict[str, Any] = {}

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        record = await jobrun.get_job_run(store, p.run.id)
        assert record is not None
        expiries[p.run.job] = record.lease_expires_at
        return jobrun.PassResult(done=True)

    registry.register("m", "short", handler, lease_ms=1_000)
    registry.register("m", "long", handler, lease_ms=90_000)
    for job in ("short", "long"):
        await jobrun.start_job_run(store, module_id="m", job=job, clock=clock)
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).completed == 2
    assert expiries == {
        "short": clock() + timedelta(seconds=1),
        "long": clock() + timedelta(seconds=90),
    }


async def test_only_the_first_pass_after_a_takeover_is_told_it_took_over(
    store: Any, clock: FakeClock
) -> None:
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    assert await claim_as(store, clock, "GONE", lease_ms=1000)
    clock.advance(seconds=2)
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    observer = _Ends()
    report = await jobrun.run_due_jobs(
        store, registry, clock=clock, observer=observer, max_passes=3
    )
    assert report.advanced == 3
    assert [(start.number, start.taken_over) for start in observer.starts] == [
        (1, True),
        (2, False),
        (3, False),
    ]


# --- drive options and registration: a bad value is named with its type ---------------------------


@pytest.mark.parametrize(
    ("keywords", "text"),
    [
        ({"observer": 5}, "observer must be a PassObserver, got int"),
        ({"clock": 5}, "clock must be a Clock or a callable returning a datetime, got int"),
        ({"options": 5}, "options must be a DriveOptions, got int"),
    ],
    ids=["observer", "clock", "options"],
)
async def test_a_bad_drive_option_is_named_with_its_type(
    keywords: dict[str, Any], text: str
) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.run_due_jobs(MemoryJobRunStore(), jobrun.JobRegistry(), **keywords)
    assert str(caught.value) == text


def test_a_max_concurrent_of_the_wrong_type_is_named_with_its_type() -> None:
    with pytest.raises(TypeError, match=r"^max_concurrent must be an int or None, got str$"):
        jobrun.JobRegistry().register("m", "j", _done, max_concurrent=cast(Any, "2"))


def test_a_registered_job_keeps_its_limit_and_its_retention() -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "j", _done, max_concurrent=3, keep_for=timedelta(hours=1))
    registered = registry.get("m", "j")
    assert registered is not None
    assert (registered.max_concurrent, registered.keep_for) == (3, timedelta(hours=1))


def test_a_keep_for_of_the_wrong_type_is_named_with_its_type() -> None:
    with pytest.raises(TypeError, match=r"^keep_for must be a timedelta or None, got int$"):
        jobrun.JobRegistry().register("m", "j", _done, keep_for=cast(Any, 5))


# --- round 3: clocks, store limits, progress, retention ------------------------------------------


class _Offsetting:
    """A store whose clock reads ``offset_s`` ahead of this host's."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    async def clock_offset_s(self) -> float:
        return self.offset_s


@pytest.mark.parametrize("offset_s", [1.0, 30.0, -30.0])
async def test_the_default_clock_follows_a_database_clock_a_second_or_more_away(
    offset_s: float,
) -> None:
    clock = await aligned_clock(_Offsetting(offset_s), None, SYSTEM_CLOCK)
    ahead_s = (clock.now() - SYSTEM_CLOCK.now()).total_seconds()
    assert abs(ahead_s - offset_s) < 0.5
    await clock.sleep(0)  # waits are this host's, unchanged
    with pytest.raises(TimeoutError):
        async with clock.timeout(0):
            # A real wait: the deadline of the system clock must cut it short.
            await clock.sleep(5)


async def test_a_database_clock_under_a_second_away_is_taken_as_this_hosts() -> None:
    assert await aligned_clock(_Offsetting(0.999), None, SYSTEM_CLOCK) is SYSTEM_CLOCK
    assert await aligned_clock(_Offsetting(-0.5), SYSTEM_CLOCK, SYSTEM_CLOCK) is SYSTEM_CLOCK


async def test_a_clock_passed_in_is_used_as_is_and_the_database_is_not_asked() -> None:
    fake = FakeClock()
    assert await aligned_clock(cast(Any, None), fake, SYSTEM_CLOCK) is fake
    wall = aligned_clock(cast(Any, None), lambda: fake.now() + timedelta(hours=1), SYSTEM_CLOCK)
    assert (await wall).now() == fake.now() + timedelta(hours=1)


class _RecordingClock:
    """A base clock that records what it is asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, object]] = []

    def now(self) -> Any:
        raise AssertionError("the wall time must come from the callable")

    def monotonic(self) -> float:
        return 42.5

    async def sleep(self, seconds: float) -> None:
        self.asked.append(("sleep", seconds))

    def timeout(self, seconds: float | None) -> Any:
        self.asked.append(("timeout", seconds))
        return contextlib.nullcontext()


async def test_a_bare_wall_clock_borrows_everything_but_the_time_from_its_base() -> None:
    base = _RecordingClock()
    moment = FakeClock().now()
    clock = as_clock(lambda: moment, cast(Any, base))
    assert clock.now() == moment
    assert clock.monotonic() == 42.5
    await clock.sleep(3.5)
    clock.timeout(7.0)
    assert base.asked == [("sleep", 3.5), ("timeout", 7.0)]
    with pytest.raises(
        TypeError, match=r"^clock must be a Clock or a callable returning a datetime, got 5$"
    ):
        as_clock(cast(Any, 5), cast(Any, base))


@pytest.mark.parametrize(
    "name", ["max_payload_bytes", "max_cursor_bytes", "max_step_result_bytes", "max_counters_bytes"]
)
def test_every_store_limit_is_checked_by_its_own_name(name: str) -> None:
    assert getattr(StoreLimits(**{name: 1}), name) == 1  # one byte is a limit
    for bad in (0, -5, "100", True, 1.5):
        with pytest.raises(ValueError, match=rf"^{name} must be a positive int, got {bad!r}$"):
            StoreLimits(**{name: bad})


def test_progress_needs_a_positive_total_however_small() -> None:
    assert progress_of({"total": 0.5, "done": 0.25}) == ("done", 0.25, 0.5)
    assert progress_of({"total": -1, "done": 0}) is None
    # Ties between other counters go to the later name, so the choice is stable.
    assert progress_of({"total": 10, "b": 4, "a": 4}) == ("b", 4, 10)


def test_a_rate_counts_a_new_counter_from_zero() -> None:
    before = jobrun.JobRun(
        id="r", module_id="m", job="j", instance="i", status="running", payload=None,
        cursor=None, counters={"objects": 4}, attempts=0, last_error=None,
        started_at=FakeClock().now(), updated_at=FakeClock().now(), next_attempt_at=None,
        ended_at=None,
    )  # fmt: skip
    after = replace(before, counters={"objects": 10, "pages": 3})
    assert Poll(before, at=10.0).follow(after, at=12.0).rates == {"objects": 3.0, "pages": 1.5}
    assert Poll(before, at=10.0).follow(after, at=9.0).rates == {}  # time ran back: no rate


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (0, "0s"),
        (45.9, "45s"),
        (-45, "-45s"),
        (59, "59s"),
        (60, "1m00s"),
        (723, "12m03s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (11100, "3h05m"),
        (86399, "23h59m"),
        (timedelta(days=2, hours=4, minutes=59), "2d04h"),
        (-timedelta(hours=3, minutes=5), "-3h05m"),
    ],
)
def test_a_span_is_the_two_largest_units(seconds: float | timedelta | None, text: str) -> None:
    assert span(seconds) == text


def test_a_retention_is_a_positive_timedelta_or_none() -> None:
    assert check_prune_after(None) is None
    assert check_prune_after(timedelta(seconds=1)) == timedelta(seconds=1)
    with pytest.raises(ValueError, match=r"^prune_after must be positive, got 0:00:00$"):
        check_prune_after(timedelta(0))
    with pytest.raises(ValueError, match="prune_after must be positive"):
        check_prune_after(timedelta(seconds=-1))
    with pytest.raises(TypeError, match=r"^prune_after must be a timedelta or None, got int$"):
        check_prune_after(7)


# --- round 3: the log lines of a pass --------------------------------------------------------


async def test_debug_lines_name_the_run_the_pass_and_each_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    store, registry = MemoryJobRunStore(), jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(max_attempts=1, base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: 1)
        await p.step("b", _refuse)
        return jobrun.PassResult(done=True)

    run = await jobrun.start_job_run(store, module_id="m", job="j", instance="i-1")
    await jobrun.run_due_jobs(store, registry, driver_name="d-1")
    lines = [(r.name, r.levelno, r.getMessage(), r.__dict__) for r in caplog.records]
    start = [line for line in lines if line[0] == "jobrun.pass" and line[1] == logging.DEBUG]
    assert [message for _, _, message, _ in start] == [
        f"pass m/j[i-1] started (run {run.id}, pass 1)"
    ]
    fields = start[0][3]
    assert (fields["run_id"], fields["module_id"], fields["job"], fields["instance"]) == (
        run.id,
        "m",
        "j",
        "i-1",
    )
    assert (fields["pass_number"], fields["driver"], fields["taken_over"]) == (1, "d-1", False)
    steps = [
        fields for name, _, _, fields in lines if name == "jobrun.step" and "outcome" in fields
    ]
    assert [(f["step"], f["outcome"], f["attempt"], f["error"]) for f in steps] == [
        ("a", "ran", 1, None),
        ("b", "failed", 1, "step 'b' failed: RuntimeError: no"),
    ]
    assert all(f["instance"] == "i-1" and f["driver"] == "d-1" for f in steps)
    ended = [
        message for name, _, message, _ in lines if name == "jobrun.step" and " in " in message
    ]
    assert ended[1].startswith("step 'b' failed in ")
    assert ended[1].endswith(f" ms (run {run.id}): step 'b' failed: RuntimeError: no")
    started = [m for name, _, m, f in lines if name == "jobrun.step" and "outcome" not in f]
    assert started == [f"step 'a' started (run {run.id})", f"step 'b' started (run {run.id})"]


def _refuse() -> None:
    raise RuntimeError("no")


class _BrokenEverywhere:
    """An observer whose every hook raises."""

    def __init__(self) -> None:
        self.passes = 0

    def pass_started(self, start: PassStart) -> _BrokenEverywhere:
        self.passes += 1
        if self.passes == 2:
            raise RuntimeError("observer bug")
        return self

    def step_started(self, name: str) -> None:
        raise RuntimeError("observer bug")

    def step_ended(self, end: jobrun.StepEnd) -> None:
        raise RuntimeError("observer bug")

    def pass_ended(self, end: PassEnd) -> None:
        raise RuntimeError("observer bug")


async def test_a_failing_observer_is_logged_by_hook_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jobrun")
    store, registry = MemoryJobRunStore(), jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step(f"s{p.cursor}", lambda: 1)
        return jobrun.PassResult(cursor=1, done=p.cursor == 1)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    observer = _BrokenEverywhere()
    for _ in range(2):
        await jobrun.run_due_jobs(store, registry, observer=cast(Any, observer))
    warnings = [r for r in caplog.records if "observer failed" in r.getMessage()]
    assert [r.getMessage() for r in warnings] == [
        f"a pass observer failed in {hook}; carrying on"
        for hook in ("step_started", "step_ended", "pass_ended", "pass_started")
    ]
    assert all(r.exc_info is not None and r.exc_info[0] is RuntimeError for r in warnings)


def test_a_pass_line_gives_its_duration_to_the_microsecond(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 0, False))
    assert watch is not None
    watch.pass_ended(PassEnd(run, 1, "completed", 0.0012345, 0, 0, 0))
    (record,) = [r for r in caplog.records if r.name == "jobrun.pass"]
    assert record.duration_ms == 1.234 or record.duration_ms == 1.235  # type: ignore[attr-defined]


# --- round 3: schedules ----------------------------------------------------------------------


def test_bad_schedules_are_refused_with_what_was_wrong() -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match=r"^cron must be a str, got int$"):
        registry.schedule("m", "j", cast(Any, 5))
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "61 * * * *")
    assert str(refused.value) == (
        "cron '61 * * * *' is not a cron expression croniter reads "
        "(five fields, or six with seconds last)"
    )
    assert refused.value.errors == [{"path": "cron", "message": "not a valid cron expression"}]
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "* * * * *", catch_up="some")
    assert str(refused.value) == "catch_up must be one of latest, all, none, got 'some'"
    assert refused.value.errors == [{"path": "catch_up", "message": "'some' is not a policy"}]
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "* * * * *", payload={"x": float("nan")})
    assert refused.value.errors[0]["path"].startswith("payload")
    assert registry.schedules() == []


def test_a_schedule_keeps_its_priority_and_its_next_slot_is_strictly_after() -> None:
    registry = jobrun.JobRegistry()
    registry.schedule("m", "j", "*/5 * * * *", priority=7)
    (schedule,) = registry.schedules()
    assert schedule.priority == 7
    ten = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert schedule.next_slot(ten + timedelta(minutes=2)) == ten + timedelta(minutes=5)
    assert schedule.next_slot(ten + timedelta(minutes=5)) == ten + timedelta(minutes=10)


class _PruneRecorder(MemoryJobRunStore):
    """A memory store that writes down the batch size of each prune."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    async def prune(
        self, ended_before: str, statuses: tuple[str, ...], batch_size: int, **kw: Any
    ) -> int:
        self.batch_sizes.append(batch_size)
        return await super().prune(ended_before, statuses, batch_size, **kw)


@pytest.mark.parametrize(("given", "used"), [({}, RETENTION_BATCH), ({"batch_size": 7}, 7)])
async def test_retention_deletes_in_short_batches(given: dict[str, int], used: int) -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "kept", _done, keep_for=timedelta(days=1))
    store = _PruneRecorder()
    deleted = await prune_by_retention(
        store,
        registry,
        prune_after=timedelta(days=7),
        clock=FakeClock(),
        sources=SYSTEM_SOURCES,
        **given,
    )
    assert (deleted, store.batch_sizes) == (0, [used, used])


def test_a_step_line_gives_its_duration_and_a_long_error_is_cut_to_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 0, False))
    assert watch is not None
    long_error = "x" * 300 + "\nsecond line"
    watch.step_ended(jobrun.StepEnd("s", "failed", 2, 0.0012345, long_error))
    (record,) = [r for r in caplog.records if r.name == "jobrun.step"]
    assert record.duration_ms == 1.234 or record.duration_ms == 1.235  # type: ignore[attr-defined]
    assert record.getMessage().endswith(" ms (run r-1): " + "x" * 197 + "...")
    assert record.error == long_error  # type: ignore[attr-defined]  # the field keeps it whole


async def test_a_pass_counts_every_step_it_ran() -> None:
    store, registry, observer = MemoryJobRunStore(), jobrun.JobRegistry(), _Ends()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in ("a", "b", "c"):
            await p.step(name, lambda: 1)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    await jobrun.run_due_jobs(store, registry, observer=observer)
    assert [(end.steps_run, end.memo_hits, end.steps_failed) for end in observer.ends] == [
        (3, 0, 0)
    ]


class _StepEnds(_Ends):
    """An observer that keeps every step's end too."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[jobrun.StepEnd] = []

    def step_ended(self, end: object) -> None:
        self.steps.append(cast(jobrun.StepEnd, end))


class _FencedStore(MemoryJobRunStore):
    """A store on which the pass's token no longer holds when a step is recorded."""

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        return False


@pytest.mark.parametrize("fenced", [False, True], ids=["reused name", "lease gone"])
async def test_a_step_refused_or_cut_off_by_a_lost_lease_is_told_as_such(fenced: bool) -> None:
    store = _FencedStore() if fenced else MemoryJobRunStore()
    registry, observer = jobrun.JobRegistry(), _StepEnds()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if not fenced:
            await p.step("a", lambda: 1)
        await p.step("a", lambda: 2)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    await jobrun.run_due_jobs(store, registry, observer=observer)
    last = observer.steps[-1]
    assert (last.name, last.outcome, last.attempt) == ("a", "lost" if fenced else "error", 0)
    assert isinstance(last.duration_s, float)
    assert last.duration_s >= 0
    run = (await jobrun.job_runs(store))[0]
    if fenced:
        assert last.error == f"run {run.id} is no longer held by this pass; it stops here"
    else:
        assert str(last.error).startswith("StepReusedError: step 'a' was already called")


async def test_retention_counts_the_runs_of_every_job_it_pruned() -> None:
    clock, store, registry = FakeClock(), MemoryJobRunStore(), jobrun.JobRegistry()
    for job in ("a", "b"):
        registry.register("m", job, _done, keep_for=timedelta(hours=1))
        await jobrun.start_job_run(store, module_id="m", job=job, instance="i", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    later = clock.now() + timedelta(hours=2)
    pruned = await prune_by_retention(
        store, registry, prune_after=None, clock=lambda: later, sources=SYSTEM_SOURCES
    )
    assert pruned == 2
    assert await jobrun.job_runs(store) == []


def test_a_taken_over_pass_says_so_and_an_error_of_200_characters_is_kept_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 2, True))
    assert watch is not None
    watch.step_ended(jobrun.StepEnd("s", "failed", 1, 0.5, "y" * 200))
    start, step = (r.getMessage() for r in caplog.records)
    assert start == "pass m/j[i] started (run r-1, pass 1, taken over)"
    assert step.endswith(" ms (run r-1): " + "y" * 200)


async def test_a_scheduled_payload_over_the_stores_cap_is_refused_as_the_payload() -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "j", _done)
    registry.schedule("m", "j", "* * * * *", payload={"text": "z" * 100})
    store = MemoryJobRunStore(limits=StoreLimits(max_payload_bytes=50))
    clock = FakeClock()
    assert await jobrun.start_scheduled_runs(store, registry, clock=clock) == []  # first sight
    with pytest.raises(jobrun.JobValidationError) as refused:
        await jobrun.start_scheduled_runs(store, registry, now=clock.now() + timedelta(minutes=1))
    assert [error["path"] for error in refused.value.errors] == ["payload"]
    assert await jobrun.job_runs(store) == []


async def test_a_schedule_seen_for_the_first_time_holds_up_no_other() -> None:
    before, after = jobrun.JobRegistry(), jobrun.JobRegistry()
    for registry in (before, after):
        registry.register("m", "old", _done)
        registry.register("m", "new", _done)
    before.schedule("m", "old", "* * * * *")
    after.schedule("m", "new", "* * * * *")  # added ahead of the one already stored
    after.schedule("m", "old", "* * * * *")
    store, clock = MemoryJobRunStore(), FakeClock()
    assert await jobrun.start_scheduled_runs(store, before, clock=clock) == []
    started = await jobrun.start_scheduled_runs(
        store, after, now=clock.now() + timedelta(minutes=1)
    )
    assert [run.job for run in started] == ["old"]


@pytest.mark.parametrize("limit", [1, JOB_RUN_LIST_MAX])
def test_a_console_query_takes_any_limit_from_one_to_the_list_maximum(limit: int) -> None:
    assert RunQuery(limit=limit).limit == limit
    with pytest.raises(ValueError, match=rf"^limit must be in \[1, {JOB_RUN_LIST_MAX}\], got 0$"):
        RunQuery(limit=0)
