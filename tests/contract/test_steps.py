"""Contract tests for steps: the per-pass ledger, memo replay, step retries.

Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.records import ClaimRequest, StepRow
from jobrun._core.rules.transitions import release_transition
from jobrun.testing import FakeClock
from tests.support import (
    JOB,
    RecordingStore,
    StatementLog,
    drive,
    iso,
    logged_store,
    registry_for,
    row_of,
    sized_store,
    start_id,
)
from tests.support import MODULE_ID as MODULE

NOW_TEXT = "2026-01-01T00:00:00.000Z"
IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0)


# --- helpers ---------------------------------------------------------------


async def plant_step(store: Any, run_id: str, row: StepRow) -> None:
    """Leave a ledger row as an earlier pass would have: claim the run, record the
    row under that lease, then hand the lease back."""
    far = "9999-12-31T00:00:00.000Z"
    request = ClaimRequest(far, "PLANTER", "test:0", {(MODULE, JOB): far})
    claimed = await store.claim(request)
    assert claimed is not None
    assert claimed.row.id == run_id
    assert await store.record_step(run_id, row, NOW_TEXT, "PLANTER")
    assert await store.release(run_id, release_transition())


def counting(calls: dict[str, int], name: str, value: Any = None) -> Callable[[], Any]:
    """A step body that counts its calls and returns ``value``."""

    def body() -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    return body


def failing(calls: dict[str, int], name: str, message: str = "boom") -> Callable[[], Any]:
    def body() -> Any:
        calls[name] = calls.get(name, 0) + 1
        raise RuntimeError(message)

    return body


def ledger_statements(log: StatementLog | None) -> list[str]:
    """The kinds of statement that touched the step ledger so far ([] for memory), the
    claim apart (on Postgres it looks whether a run it takes has a ledger at all)."""
    if log is None:
        return []
    return [
        sql.split(None, 1)[0].upper()
        for operation, sql, _ in log.seen
        if "_substrat_job_steps" in sql and operation != "claim"
    ]


# --- durability and replay ---------------------------------------------------


async def test_completed_steps_survive_a_later_failure_and_replay_without_calling_fn(
    store: Any, clock: FakeClock
) -> None:
    calls: dict[str, int] = {}

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        a = await p.step("a", counting(calls, "a", 1))
        b = await p.step("b", counting(calls, "b", "two"))
        c = await p.step("c", failing(calls, "c") if "c" not in calls else counting(calls, "c", 3))
        return jobrun.PassResult(cursor=[a, b, c])

    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)

    first = await drive(store, registry, clock)
    assert first.retrying == 1
    ledger = await store.steps(run_id)
    assert ledger["a"] == StepRow("a", "1", 1, None)
    assert ledger["b"] == StepRow("b", '"two"', 1, None)
    assert ledger["c"].result is None
    assert ledger["c"].attempts == 1
    assert ledger["c"].last_error == "RuntimeError: boom"

    second = await drive(store, registry, clock)
    assert second.advanced == 1
    assert calls == {"a": 1, "b": 1, "c": 2}
    assert (await row_of(store, run_id)).cursor == '[1,"two",3]'
    assert await store.steps(run_id) == {}


async def test_memo_hits_cost_one_ledger_read_and_a_fresh_step_one_write(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    names = ["s1", "s2", "s3", "s4"]
    calls: dict[str, int] = {}
    log = None
    if engine is not None:
        store, log = logged_store(engine)
    counted = RecordingStore(store)
    snapshots: list[tuple[int, int, list[str]]] = []

    def ledger_so_far() -> tuple[int, int, list[str]]:
        """Ledger reads, ledger writes, and the SQL kinds that touched the ledger."""
        return counted.count("steps"), counted.count("record_step"), ledger_statements(log)

    async def handler(p: jobrun.JobPass) -> None:
        calls["pass"] = calls.get("pass", 0) + 1
        for name in names:
            assert await p.step(name, counting(calls, name, name.upper())) == name.upper()
        if calls["pass"] == 1:
            raise RuntimeError("first pass stops here")
        snapshots.append(ledger_so_far())
        await p.step("fresh", counting(calls, "fresh", 0))
        snapshots.append(ledger_so_far())
        return jobrun.PassResult()

    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)
    await drive(counted, registry, clock)
    assert counted.count("record_step") == len(names)
    assert len(await store.steps(run_id)) == len(names)

    counted.calls.clear()
    if log is not None:
        log.seen.clear()
    report = await drive(counted, registry, clock)
    assert report.advanced == 1
    assert calls == {"pass": 2, **dict.fromkeys(names, 1), "fresh": 1}
    (reads, writes, sql), (reads_after, writes_after, sql_after) = snapshots
    # Replaying four completed steps: one ledger read, no write.
    assert (reads, writes) == (1, 0)
    # A fresh step: exactly one more write, no further read.
    assert (reads_after, writes_after) == (1, 1)
    if engine is not None:
        assert sql == ["SELECT"]
        assert sql_after == ["SELECT", "INSERT"]


async def test_step_values_come_back_through_json_on_the_first_run_too(
    store: Any, clock: FakeClock
) -> None:
    seen: list[list[Any]] = []

    async def handler(p: jobrun.JobPass) -> None:
        values = [
            await p.step("tuple", lambda: (1, 2)),
            await p.step("nested", lambda: {"k": (3, (4,))}),
            await p.step("int-keys", lambda: {1: "a"}),
            await p.step("nothing", lambda: None),
            await p.step("async", _async_value),
        ]
        seen.append(values)
        if len(seen) == 1:
            raise RuntimeError("replay next")

    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)
    expected = [[1, 2], {"k": [3, [4]]}, {"1": "a"}, None, {"from": "coroutine"}]
    assert seen[0] == expected
    ledger = await store.steps(run_id)
    assert ledger["tuple"].result == "[1,2]"
    assert ledger["nothing"].result == "null"

    await drive(store, registry, clock)
    assert seen[1] == expected


async def _async_value() -> dict[str, str]:
    return {"from": "coroutine"}


@pytest.mark.parametrize(
    "value",
    [datetime(2026, 1, 1, tzinfo=UTC), {1, 2}, math.nan],
    ids=["datetime", "set", "nan"],
)
async def test_a_value_json_cannot_store_fails_the_run_at_once(
    store: Any, clock: FakeClock, value: Any
) -> None:
    bodies = 0

    def body() -> Any:
        nonlocal bodies
        bodies += 1
        return value

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("keep", lambda: "fine")
        # A mistake, not a failed attempt: the run fails at once, whatever the policy.
        await p.step("when", body)

    registry = registry_for(handler)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock)

    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.last_error is not None
    assert row.last_error.startswith("step 'when' returned a value that cannot be stored: ")
    assert report.errors[0].error == row.last_error
    assert bodies == 1
    ledger = await store.steps(run_id)
    # Nothing is recorded for the step: after a resume its (fixed) body runs again.
    assert "when" not in ledger
    assert ledger["keep"].result == '"fine"'


async def test_a_step_result_over_the_stores_cap_fails_the_run_at_once(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    capped = sized_store(store, engine, max_step_result_bytes=32)
    exactly_at_cap = "x" * 30  # 32 bytes of JSON with its quotes

    async def handler(p: jobrun.JobPass) -> None:
        assert await p.step("fits", lambda: exactly_at_cap) == exactly_at_cap
        await p.step("big", lambda: "y" * 100)

    registry = registry_for(handler)
    run_id = await start_id(capped, clock)
    report = await drive(capped, registry, clock)

    assert report.failed == 1
    row = await row_of(capped, run_id)
    assert row.last_error is not None
    assert row.last_error.startswith("step 'big' returned a value that cannot be stored: ")
    assert "over the 32-byte cap" in row.last_error
    ledger = await capped.steps(run_id)
    assert ledger["fits"].result == f'"{exactly_at_cap}"'
    assert "big" not in ledger


# --- names -------------------------------------------------------------------


async def test_reusing_a_step_name_in_one_pass_is_a_conflict(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}
    caught: list[BaseException] = []

    async def catching(p: jobrun.JobPass) -> None:
        await p.step("a", counting(calls, "a", 1))
        try:
            await p.step("a", counting(calls, "again", 2))
        except jobrun.StepReusedError as error:
            caught.append(error)
        return jobrun.PassResult()

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(catching), clock)

    # Caught by the handler: the pass commits normally.
    assert report.advanced == 1
    assert calls == {"a": 1}
    (error,) = caught
    assert isinstance(error, jobrun.JobConflictError)
    assert isinstance(error, jobrun.JobRunError)
    assert error.code == "conflict"
    assert error.reason == "job_step_reused"
    assert "'a'" in str(error)
    assert (await row_of(store, run_id)).attempts == 0


async def test_an_uncaught_step_name_reuse_fails_the_run_at_once(
    store: Any, clock: FakeClock
) -> None:
    calls: dict[str, int] = {}

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("a", counting(calls, "a", 1))
        await p.step("a", counting(calls, "again", 2))

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)

    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.attempts == 1
    assert row.last_error is not None
    assert "'a'" in row.last_error
    assert row.cursor is None
    assert calls == {"a": 1}
    # The first call's result stays in the ledger for the next pass.
    assert (await store.steps(run_id))["a"].result == "1"


async def test_reuse_is_refused_even_when_the_first_call_failed(
    store: Any, clock: FakeClock
) -> None:
    calls: dict[str, int] = {}
    caught: list[BaseException] = []

    async def handler(p: jobrun.JobPass) -> None:
        try:
            await p.step("a", failing(calls, "a"))
        except jobrun.StepFailedError as error:
            caught.append(error)
        try:
            await p.step("a", counting(calls, "second", 2))
        except jobrun.StepReusedError as error:
            caught.append(error)
        return jobrun.PassResult()

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)

    assert [type(error) for error in caught] == [jobrun.StepFailedError, jobrun.StepReusedError]
    assert calls == {"a": 1}
    assert report.advanced == 1
    assert (await row_of(store, run_id)).status == "running"


async def test_reuse_is_refused_after_a_memo_hit(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("a", counting(calls, "a", 1))
        if calls.get("a") == 1 and "boom" not in calls:
            calls["boom"] = 1
            raise RuntimeError("replay")
        await p.step("a", counting(calls, "second", 2))

    run_id = await start_id(store, clock)
    await drive(store, registry_for(handler, IMMEDIATE), clock)
    report = await drive(store, registry_for(handler, IMMEDIATE), clock)

    assert report.failed == 1
    assert "second" not in calls
    row = await row_of(store, run_id)
    assert row.attempts == 2
    assert row.last_error is not None
    assert "'a'" in row.last_error


@pytest.mark.parametrize(
    ("name", "expected"),
    [("", "step name '' is empty"), (3, "int"), (None, "NoneType"), (b"a", "bytes")],
    ids=["empty", "int", "none", "bytes"],
)
async def test_a_step_name_must_be_a_non_empty_str(
    store: Any, clock: FakeClock, name: Any, expected: str
) -> None:
    calls: dict[str, int] = {}
    caught: list[BaseException] = []

    async def handler(p: jobrun.JobPass) -> None:
        try:
            await p.step(name, counting(calls, "body", 1))
        except Exception as error:
            caught.append(error)
            raise

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)

    (error,) = caught
    assert isinstance(error, jobrun.HandlerMistakeError)
    assert expected in str(error)
    assert calls == {}
    assert report.failed == 1
    assert await store.steps(run_id) == {}


# --- the spent guard -----------------------------------------------------------


@pytest.mark.parametrize(
    ("prior_error", "cause"),
    [("RuntimeError: upstream down", "RuntimeError: upstream down"), (None, "exhausted")],
    ids=["with-error", "without-error"],
)
async def test_a_spent_step_is_not_called_and_nothing_is_written(
    store: Any,
    engine: AsyncEngine | None,
    clock: FakeClock,
    prior_error: str | None,
    cause: str,
) -> None:
    calls: dict[str, int] = {}
    caught: list[jobrun.StepFailedError] = []

    async def handler(p: jobrun.JobPass) -> None:
        try:
            await p.step("s", counting(calls, "s", 1))
        except jobrun.StepFailedError as error:
            caught.append(error)
            raise

    run_id = await start_id(store, clock)
    prior = StepRow("s", None, 3, prior_error)
    await plant_step(store, run_id, prior)

    registry = registry_for(handler, jobrun.RetryPolicy(max_attempts=3))
    log = None
    if engine is not None:
        store, log = logged_store(engine)
    report = await drive(store, registry, clock)
    statements = ledger_statements(log)

    assert calls == {}
    (error,) = caught
    assert error.attempts == 3
    assert await store.steps(run_id) == {"s": prior}
    if engine is not None:
        assert statements == ["SELECT"]
    # Judged by the step's three spent attempts: the run fails now.
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.last_error == f"step 's' failed: {cause}"
    assert row.attempts == 1


async def test_a_memo_hit_wins_over_the_spent_guard(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}
    seen: list[Any] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(await p.step("s", counting(calls, "s", "fresh")))
        return jobrun.PassResult()

    run_id = await start_id(store, clock)
    await plant_step(store, run_id, StepRow("s", '"memo"', 7, None))
    registry = registry_for(handler, jobrun.RetryPolicy(max_attempts=1))
    report = await drive(store, registry, clock)

    assert seen == ["memo"]
    assert calls == {}
    assert report.advanced == 1


# --- step policies and what is judged ---------------------------------------------


async def test_a_step_policy_replaces_the_job_policy_wholesale(
    store: Any, clock: FakeClock
) -> None:
    calls: dict[str, int] = {}

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("s", failing(calls, "s"), retry=jobrun.RetryPolicy(max_attempts=2))

    # The job would allow 5 attempts with no wait; the step gets neither.
    job_policy = jobrun.RetryPolicy(max_attempts=5, base_delay_ms=0, max_delay_ms=0)
    registry = registry_for(handler, job_policy)
    run_id = await start_id(store, clock)

    first = await drive(store, registry, clock)
    assert first.retrying == 1
    row = await row_of(store, run_id)
    # Base delay back at its default of 1000 ms (random 0.5 gives a factor of 1).
    assert row.next_attempt_at == iso(clock() + timedelta(milliseconds=1000))

    assert (await drive(store, registry, clock)).attempted == 0
    clock.advance(seconds=1)
    second = await drive(store, registry, clock)
    assert second.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.attempts == 2
    assert row.next_attempt_at is None
    assert row.ended_at == iso(clock())
    assert calls == {"s": 2}
    assert (await store.steps(run_id))["s"].attempts == 2


async def test_a_step_may_allow_more_attempts_than_its_job(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}
    step_policy = jobrun.RetryPolicy(max_attempts=4, base_delay_ms=0)

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("s", failing(calls, "s"), retry=step_policy)

    registry = registry_for(handler, jobrun.RetryPolicy(max_attempts=2, base_delay_ms=0))
    run_id = await start_id(store, clock)

    outcomes = []
    for _ in range(4):
        report = await drive(store, registry, clock)
        outcomes.append("failed" if report.failed else "retrying" if report.retrying else "?")
    # Run attempts passed the job's 2 long ago; only the step's 4 count.
    assert outcomes == ["retrying", "retrying", "retrying", "failed"]
    row = await row_of(store, run_id)
    assert row.attempts == 4
    assert calls == {"s": 4}


async def test_a_non_step_failure_is_judged_by_run_attempts(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}
    generous = jobrun.RetryPolicy(max_attempts=10, base_delay_ms=0)

    async def handler(p: jobrun.JobPass) -> None:
        if calls.get("s", 0) < 2:
            await p.step("s", failing(calls, "s"), retry=generous)
        await p.step("s", counting(calls, "s", "ok"), retry=generous)
        raise ValueError("after the step")

    registry = registry_for(handler, jobrun.RetryPolicy(max_attempts=3, base_delay_ms=0))
    run_id = await start_id(store, clock)

    assert (await drive(store, registry, clock)).retrying == 1
    assert (await drive(store, registry, clock)).retrying == 1
    # The first non-step failure, but the third consecutive failed pass: the job's
    # three attempts are spent, counting the step failures before it.
    third = await drive(store, registry, clock)
    assert third.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.attempts == 3
    assert row.last_error == "ValueError: after the step"
    assert (await store.steps(run_id))["s"] == StepRow("s", '"ok"', 3, None)


async def test_backoff_uses_the_counter_of_the_failure_kind(store: Any, clock: FakeClock) -> None:
    calls: dict[str, int] = {}

    async def handler(p: jobrun.JobPass) -> None:
        passes = calls["pass"] = calls.get("pass", 0) + 1
        if passes == 1:
            raise RuntimeError("outside any step")
        if passes == 2:
            await p.step("s", failing(calls, "s"))
        await p.step("s", counting(calls, "s"))
        raise RuntimeError("outside again")

    registry = registry_for(handler, jobrun.RetryPolicy(base_delay_ms=100))
    run_id = await start_id(store, clock)

    observed = []
    for _ in range(3):
        failed_at = clock()
        await drive(store, registry, clock)
        row = await row_of(store, run_id)
        observed.append((row.attempts, row.next_attempt_at, failed_at))
        clock.advance(seconds=10)

    # Run attempts 1 -> 100 ms; a step's first failure (run attempts 2) -> 100 ms,
    # by the step's own count; run attempts 3 -> 400 ms.
    assert [(attempts, at) for attempts, at, _ in observed] == [
        (1, iso(observed[0][2] + timedelta(milliseconds=100))),
        (2, iso(observed[1][2] + timedelta(milliseconds=100))),
        (3, iso(observed[2][2] + timedelta(milliseconds=400))),
    ]


async def test_run_attempts_count_failed_passes_and_reset_on_commit(
    store: Any, clock: FakeClock
) -> None:
    script = ["fail", "fail-step", "commit", "fail"]
    position: dict[str, int] = {"at": 0}

    async def handler(p: jobrun.JobPass) -> None:
        action = script[position["at"]]
        position["at"] += 1
        if action == "fail":
            raise RuntimeError("nope")
        if action == "fail-step":
            await p.step("s", failing({}, "s"))
        return jobrun.PassResult()

    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)

    observed = []
    for _ in script:
        await drive(store, registry, clock)
        row = await row_of(store, run_id)
        observed.append((row.attempts, row.last_error is None, row.next_attempt_at))
    at = iso(clock())
    assert observed == [(1, False, at), (2, False, at), (0, True, None), (1, False, at)]
