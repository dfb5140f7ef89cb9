"""Contract tests for passes: outcomes, backoff, commits, handler results, scope.

Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import math
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.engine.outcomes import MAX_ERROR_TEXT_BYTES, cap_error_text
from jobrun._core.model.records import StepRow
from jobrun.testing import FakeClock
from tests.support import (
    JOB,
    PassEnds,
    claim_as,
    done_at_once,
    drive,
    iso,
    registry_for,
    row_of,
    set_columns,
    sized_store,
    start_id,
)
from tests.support import MODULE_ID as MODULE

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0)
ERROR_CAP_BYTES = 8 * 1024


# --- helpers ---------------------------------------------------------------


def script(*actions: Callable[[jobrun.JobPass], Any]) -> Callable[[jobrun.JobPass], Any]:
    """A handler that runs ``actions[n]`` on its n-th pass (the last one repeats)."""
    position = {"at": 0}

    async def handler(p: jobrun.JobPass) -> Any:
        action = actions[min(position["at"], len(actions) - 1)]
        position["at"] += 1
        result = action(p)
        return await result if asyncio.iscoroutine(result) else result

    return handler


def raise_(error: BaseException) -> Callable[[jobrun.JobPass], Any]:
    def action(_p: jobrun.JobPass) -> Any:
        raise error

    return action


def returns(value: Any) -> Callable[[jobrun.JobPass], Any]:
    return lambda _p: value


# --- backoff -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "random", "delays_ms"),
    [
        # Doubling from the base, then held at the cap.
        (jobrun.RetryPolicy(max_attempts=9, max_delay_ms=3000), 0.25, [900, 1800, 2700, 2700]),
        # Fractional milliseconds are truncated (12.88 -> 12), not rounded.
        (jobrun.RetryPolicy(max_attempts=9, base_delay_ms=7), 0.3, [6, 12, 25]),
        # Jitter is applied after the cap, so a wait may exceed max_delay_ms.
        (jobrun.RetryPolicy(max_attempts=9, max_delay_ms=1500), 0.999, [1199, 1799]),
        # A zero wait is never jittered.
        (jobrun.RetryPolicy(max_attempts=9, base_delay_ms=0), 0.999, [0, 0, 0]),
    ],
    ids=["doubling-capped", "truncated", "jitter-after-cap", "zero"],
)
async def test_backoff_after_each_failed_pass(
    store: Any,
    policy: jobrun.RetryPolicy,
    random: float,
    delays_ms: list[int],
) -> None:
    clock = FakeClock(datetime(2026, 3, 4, 5, 6, 7, 123_456, tzinfo=UTC))
    registry = registry_for(raise_(RuntimeError("again")), policy)
    run_id = await start_id(store, clock)

    for attempt, delay in enumerate(delays_ms, start=1):
        failed_at = clock()
        report = await drive(store, registry, clock, random=lambda: random)
        assert report.retrying == 1, f"attempt {attempt} was not run"
        row = await row_of(store, run_id)
        assert row.attempts == attempt
        assert row.updated_at == iso(failed_at)
        truncated = failed_at.replace(microsecond=failed_at.microsecond // 1000 * 1000)
        assert row.next_attempt_at == iso(truncated + timedelta(milliseconds=delay))
        if delay:
            # Not due a millisecond before its time, due exactly at it.
            clock.advance(milliseconds=delay - 1)
            assert (await drive(store, registry, clock)).attempted == 0
            clock.advance(milliseconds=1)


async def test_exhaustion_fails_the_run_without_a_next_attempt(
    store: Any, clock: FakeClock
) -> None:
    registry = registry_for(raise_(RuntimeError("x")), jobrun.RetryPolicy(2, 0))
    run_id = await start_id(store, clock)
    assert (await drive(store, registry, clock)).retrying == 1
    report = await drive(store, registry, clock)
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert (row.status, row.attempts, row.next_attempt_at, row.ended_at) == (
        "failed",
        2,
        None,
        iso(clock()),
    )
    assert row.last_error == "RuntimeError: x"
    assert (await drive(store, registry, clock)).attempted == 0


# --- what a failed pass writes --------------------------------------------------


async def test_a_failed_pass_writes_back_the_committed_cursor_and_counters(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []

    def commit(p: jobrun.JobPass) -> Any:
        p.count("items", 2)
        return {"cursor": {"page": 1}}

    def count_then_fail(p: jobrun.JobPass) -> Any:
        p.count("items", 5)
        p.count("other")
        raise RuntimeError("mid-page")

    def look(p: jobrun.JobPass) -> Any:
        seen.append((p.cursor, dict(p.counters)))

    registry = registry_for(script(commit, count_then_fail, look), IMMEDIATE)
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)
    committed = await row_of(store, run_id)
    assert (committed.cursor, committed.counters) == ('{"page":1}', '{"items":2}')

    # Non-canonical (but valid) text must come back byte for byte.
    await set_columns(store, engine, run_id, cursor='{ "page" : 1 }', counters='{ "items" : 2 }')
    assert (await drive(store, registry, clock)).retrying == 1
    failed = await row_of(store, run_id)
    assert (failed.cursor, failed.counters) == ('{ "page" : 1 }', '{ "items" : 2 }')

    await drive(store, registry, clock)
    assert seen == [({"page": 1}, {"items": 2})]


async def test_the_ledger_is_kept_on_failure_and_dropped_on_commit(
    store: Any, clock: FakeClock
) -> None:
    calls: list[str] = []

    async def handler(p: jobrun.JobPass) -> Any:
        await p.step("a", lambda: calls.append("a"))
        if calls.count("a") == 1 and "failed" not in calls:
            calls.append("failed")
            raise RuntimeError("after a")
        return {"cursor": len(calls)}

    registry = registry_for(handler, IMMEDIATE)
    run_id = await start_id(store, clock)

    await drive(store, registry, clock)
    assert (await store.steps(run_id))["a"].result == "null"
    await drive(store, registry, clock)
    assert await store.steps(run_id) == {}
    assert calls == ["a", "failed"]
    # The name repeats in the next pass: the dropped ledger means it runs again.
    await drive(store, registry, clock)
    assert calls == ["a", "failed", "a"]
    assert await store.steps(run_id) == {}


async def test_a_run_that_ends_failed_keeps_its_ledger_and_a_done_run_has_none(
    store: Any, clock: FakeClock
) -> None:
    async def fails(p: jobrun.JobPass) -> None:
        await p.step("evidence", lambda: {"seen": 1})
        raise RuntimeError("gives up")

    async def finishes(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("last", lambda: 1)
        return jobrun.PassResult(done=True)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, fails, retry=jobrun.RetryPolicy(max_attempts=1))
    registry.register(MODULE, "finish", finishes)
    failed_id = await start_id(store, clock)
    done = await jobrun.start_job_run(store, module_id=MODULE, job="finish", clock=clock)

    report = await drive(store, registry, clock)
    assert (report.failed, report.completed) == (1, 1)
    assert await store.steps(failed_id) == {"evidence": StepRow("evidence", '{"seen":1}', 1, None)}
    assert await store.steps(done.id) == {}
    assert (await row_of(store, done.id)).status == "done"


# --- handler results -----------------------------------------------------------

COMMITTED = '"c0"'


@pytest.mark.parametrize(
    ("result", "cursor", "status"),
    [
        (jobrun.PassResult(), COMMITTED, "running"),
        (jobrun.PassResult(cursor=None), "null", "running"),
        (jobrun.PassResult(cursor={"p": [2, "é"]}), '{"p":[2,"é"]}', "running"),
        (jobrun.PassResult(done=True), COMMITTED, "done"),
        (jobrun.PassResult(cursor=None, done=True), "null", "done"),
        ({}, COMMITTED, "running"),
        ({"cursor": 5}, "5", "running"),
        ({"cursor": None}, "null", "running"),
        ({"done": True}, COMMITTED, "done"),
        ({"cursor": 1.5, "done": True}, "1.5", "done"),
        (types.MappingProxyType({"cursor": "m"}), '"m"', "running"),
        ({"done": False}, COMMITTED, "running"),
    ],
    ids=[
        "empty-passresult",
        "passresult-null",
        "passresult-cursor",
        "passresult-done",
        "passresult-null-done",
        "empty-mapping",
        "mapping-cursor",
        "mapping-null",
        "mapping-done",
        "mapping-both",
        "mapping-proxy",
        "mapping-not-done",
    ],
)
async def test_handler_results_that_commit(
    store: Any, clock: FakeClock, result: Any, cursor: str, status: str
) -> None:
    registry = registry_for(script(returns({"cursor": "c0"}), returns(result)))
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)
    assert (await row_of(store, run_id)).cursor == COMMITTED

    clock.advance(seconds=1)
    report = await drive(store, registry, clock)
    row = await row_of(store, run_id)
    assert (row.cursor, row.status) == (cursor, status)
    assert (row.attempts, row.last_error, row.next_attempt_at) == (0, None, None)
    assert row.updated_at == iso(clock())
    if status == "done":
        assert report.completed == 1
        assert row.ended_at == iso(clock())
    else:
        assert report.advanced == 1
        assert row.ended_at is None


async def test_keeping_the_cursor_keeps_its_text_verbatim(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    registry = registry_for(returns(jobrun.PassResult()))
    run_id = await start_id(store, clock)
    await set_columns(store, engine, run_id, cursor='{ "page" : 3 }')
    await drive(store, registry, clock)
    assert (await row_of(store, run_id)).cursor == '{ "page" : 3 }'


@pytest.mark.parametrize(
    ("result", "named"),
    [
        ({"curser": 3}, "curser"),
        ({"cursor": 3, "dne": True}, "dne"),
        ([1, 2], "list"),
        (7, "int"),
        ("done", "str"),
        (True, "bool"),
        # Revised for Python: a forgotten return, and a done that is not a bool.
        (None, "did you forget `return`?"),
        ({"done": 1}, "done=1 (an int)"),
        ({"done": "yes"}, "done='yes' (a str)"),
        (jobrun.PassResult(done=1), "done must be True or False"),  # type: ignore[arg-type]
    ],
    ids=[
        "typo-curser",
        "extra-key",
        "list",
        "int",
        "str",
        "bool",
        "none",
        "done-1",
        "done-yes",
        "passresult-done-1",
    ],
)
async def test_handler_results_that_fail_the_run_at_once(
    store: Any, clock: FakeClock, result: Any, named: str
) -> None:
    registry = registry_for(script(returns({"cursor": "c0"}), returns(result)))
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)

    report = await drive(store, registry, clock)
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.cursor == COMMITTED
    assert row.attempts == 1
    assert row.last_error is not None
    assert named in row.last_error


async def test_sync_and_async_handlers_both_work(store: Any, clock: FakeClock) -> None:
    def sync_handler(p: jobrun.JobPass) -> dict[str, Any]:
        p.count("sync")
        return {"cursor": "from-sync", "done": True}

    async def async_handler(p: jobrun.JobPass) -> dict[str, Any]:
        # sleep: a real suspension, so the handler is truly async
        await asyncio.sleep(0)
        p.count("async")
        return {"cursor": "from-async", "done": True}

    def sync_failing(_p: jobrun.JobPass) -> None:
        raise LookupError("sync trouble")

    registry = jobrun.JobRegistry()
    registry.register(MODULE, "sync", sync_handler)
    registry.register(MODULE, "async", async_handler)
    registry.register(MODULE, "sync-failing", sync_failing)
    ids = {}
    for job in ("sync", "async", "sync-failing"):
        run = await jobrun.start_job_run(store, module_id=MODULE, job=job, clock=clock)
        ids[job] = run.id

    report = await drive(store, registry, clock)
    assert (report.completed, report.retrying) == (2, 1)
    sync_row = await row_of(store, ids["sync"])
    assert (sync_row.cursor, sync_row.counters) == ('"from-sync"', '{"sync":1}')
    async_row = await row_of(store, ids["async"])
    assert (async_row.cursor, async_row.counters) == ('"from-async"', '{"async":1}')
    assert (await row_of(store, ids["sync-failing"])).last_error == "LookupError: sync trouble"


# --- cursor checks -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cursor", "path", "what"),
    [
        ({1, 2}, "cursor", "set"),
        ((1, 2), "cursor", "tuple"),
        ({"a": [b"x"]}, "cursor.a.0", "bytes"),
        ({"page": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}, "cursor.page.when", "datetime"),
        ({"m": {1: "v"}}, "cursor.m.1", "int"),
        ([0, math.inf], "cursor.1", "inf"),
    ],
    ids=["set", "tuple", "nested-bytes", "nested-datetime", "int-key", "inf"],
)
async def test_a_cursor_that_is_not_queue_safe_fails_the_pass(
    store: Any, clock: FakeClock, cursor: Any, path: str, what: str
) -> None:
    def unsafe(p: jobrun.JobPass) -> Any:
        p.count("n")
        return jobrun.PassResult(cursor=cursor)

    registry = registry_for(script(returns({"cursor": "c0"}), unsafe))
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)

    report = await drive(store, registry, clock)
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert (row.cursor, row.counters, row.status) == (COMMITTED, "{}", "failed")
    assert row.last_error is not None
    assert f"{path} is" in row.last_error
    assert what in row.last_error


async def test_a_cursor_over_the_cap_is_refused(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    capped = sized_store(store, engine, max_cursor_bytes=20)
    at_cap = "x" * 18  # 20 bytes of JSON with its quotes
    registry = registry_for(script(returns({"cursor": at_cap}), returns({"cursor": "y" * 19})))
    run_id = await start_id(capped, clock)

    assert (await drive(capped, registry, clock)).advanced == 1
    assert (await row_of(capped, run_id)).cursor == f'"{at_cap}"'
    assert (await drive(capped, registry, clock)).failed == 1
    row = await row_of(capped, run_id)
    assert row.cursor == f'"{at_cap}"'
    assert row.last_error is not None
    # The refusal names the cap (the encoder stops early, so the size is a bound).
    assert "20-byte cap" in row.last_error


# --- counters ------------------------------------------------------------------------


async def test_count_adds_to_counters_committed_with_the_pass(store: Any, clock: FakeClock) -> None:
    def counts(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("pages")
        p.count("pages")
        p.count("bytes", 0.25)
        p.count("bytes", 1)
        return jobrun.PassResult()

    registry = registry_for(counts)
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)
    assert (await row_of(store, run_id)).counters == '{"pages":2,"bytes":1.25}'
    await drive(store, registry, clock)
    assert (await row_of(store, run_id)).counters == '{"pages":4,"bytes":2.5}'


@pytest.mark.parametrize("by", ["1", True, None, math.nan, [1]], ids=repr)
async def test_count_with_a_non_number_fails_the_run_at_once(
    store: Any, clock: FakeClock, by: Any
) -> None:
    def counts(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("good")
        p.count("bad", by)
        return jobrun.PassResult()

    registry = registry_for(counts)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock)
    assert report.failed == 1
    row = await row_of(store, run_id)
    assert row.counters == "{}"
    assert row.last_error is not None
    assert row.last_error.startswith(f"p.count('bad', by={by!r}): by must be a finite")


# --- the scope door ----------------------------------------------------------------


@pytest.mark.parametrize("opener_kind", ["sync", "async"])
async def test_scope_is_opened_lazily_once_per_pass_with_the_run_key(
    store: Any, clock: FakeClock, opener_kind: str
) -> None:
    events: list[Any] = []

    def open_sync(run: Any) -> dict[str, Any]:
        events.append(("open", run))
        return {"scope-for": run.id}

    async def open_async(run: Any) -> dict[str, Any]:
        # sleep: a real suspension, so the scope opener is truly async
        await asyncio.sleep(0)
        return open_sync(run)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        events.append("handler")
        first = await p.scope()
        together = await asyncio.gather(p.scope(), p.scope())
        assert all(scope is first for scope in together)
        assert await p.scope() is first
        events.append(first)
        return jobrun.PassResult()

    registry = registry_for(handler)
    run_id = await start_id(store, clock)
    opener = open_sync if opener_kind == "sync" else open_async
    report = await drive(store, registry, clock, open_scope=opener, max_passes=2)

    assert report.advanced == 2
    key = jobrun.RunKey(run_id, MODULE, JOB, "default")
    assert events == ["handler", ("open", key), {"scope-for": run_id}] * 2
    run_key = events[1][1]
    assert (run_key.id, run_key.module_id, run_key.job, run_key.instance) == (
        run_id,
        MODULE,
        JOB,
        "default",
    )


async def test_scope_is_not_opened_when_unused(store: Any, clock: FakeClock) -> None:
    opened: list[Any] = []
    registry = registry_for(lambda p: jobrun.PassResult())
    await start_id(store, clock)
    report = await drive(store, registry, clock, open_scope=opened.append)
    assert report.advanced == 1
    assert opened == []


async def test_the_default_scope_is_the_stores(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    seen: list[Any] = []

    async def handler(p: jobrun.JobPass) -> None:
        seen.append(await p.scope())

    await start_id(store, clock)
    await drive(store, registry_for(handler), clock)
    assert len(seen) == 1
    assert seen[0] is store.default_scope
    if engine is not None:
        assert seen[0] is engine


async def test_a_scope_that_cannot_open_fails_the_pass(store: Any, clock: FakeClock) -> None:
    def refuse(_run: Any) -> Any:
        raise PermissionError("scope not active")

    async def handler(p: jobrun.JobPass) -> None:
        await p.scope()

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock, open_scope=refuse)
    assert report.retrying == 1
    assert (await row_of(store, run_id)).last_error == "PermissionError: scope not active"


# --- error texts -----------------------------------------------------------------------


async def test_stored_error_texts_carry_the_type(store: Any, clock: FakeClock) -> None:
    def key_error(_p: jobrun.JobPass) -> None:
        raise KeyError("x")

    async def step_error(p: jobrun.JobPass) -> None:
        def fetch() -> None:
            raise TimeoutError("upstream timed out")

        await p.step("fetch-page-3", fetch)

    registry = jobrun.JobRegistry()
    registry.register(MODULE, "key", key_error)
    registry.register(MODULE, "step", step_error)
    key_run = await jobrun.start_job_run(store, module_id=MODULE, job="key", clock=clock)
    step_run = await jobrun.start_job_run(store, module_id=MODULE, job="step", clock=clock)

    report = await drive(store, registry, clock)
    key_text = "KeyError: 'x'"
    step_text = "step 'fetch-page-3' failed: TimeoutError: upstream timed out"
    assert (await row_of(store, key_run.id)).last_error == key_text
    assert (await row_of(store, step_run.id)).last_error == step_text
    assert {(error.run_id, error.error) for error in report.errors} == {
        (key_run.id, key_text),
        (step_run.id, step_text),
    }
    ledger = await store.steps(step_run.id)
    assert ledger["fetch-page-3"].last_error == "TimeoutError: upstream timed out"


async def test_a_huge_error_text_is_cut_with_a_visible_marker(store: Any, clock: FakeClock) -> None:
    huge = "é" * 20_000  # two bytes each in UTF-8

    async def handler(p: jobrun.JobPass) -> None:
        if p.cursor is None:

            def explode() -> None:
                raise ValueError(huge)

            await p.step("explode", explode)
        raise RuntimeError(huge)

    registry = registry_for(script(handler, returns({"cursor": 1}), handler), IMMEDIATE)
    run_id = await start_id(store, clock)
    await drive(store, registry, clock)

    step_failure = (await row_of(store, run_id)).last_error
    ledger_error = (await store.steps(run_id))["explode"].last_error
    await drive(store, registry, clock)
    await drive(store, registry, clock)
    plain_failure = (await row_of(store, run_id)).last_error

    for text, prefix in [
        (step_failure, "step 'explode' failed: ValueError: éé"),
        (ledger_error, "ValueError: éé"),
        (plain_failure, "RuntimeError: éé"),
    ]:
        assert text is not None
        assert text.startswith(prefix)
        assert len(text.encode("utf-8")) <= ERROR_CAP_BYTES
        assert "cut" in text[-64:]


# --- interruption and time budget ----------------------------------------------------


async def test_a_pass_over_its_time_budget_is_a_failed_pass(store: Any, clock: FakeClock) -> None:
    """The budget runs on the drive's clock: advancing the fake clock past it ends the pass."""
    hung = asyncio.Event()

    async def hangs(p: jobrun.JobPass) -> None:
        await p.step("before", lambda: 1)
        hung.set()
        await asyncio.Event().wait()

    async def finishes(p: jobrun.JobPass) -> dict[str, Any]:
        return {"cursor": await p.step("before", lambda: 2)}

    # A lease longer than the budget: advancing the clock 300 s at once is an event
    # loop stalled that long, which a shorter lease's self-fence would end first.
    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, script(hangs, finishes), retry=IMMEDIATE, lease_ms=3_600_000)
    run_id = await start_id(store, clock)

    driving = asyncio.create_task(drive(store, registry, clock, pass_timeout_s=300))
    await asyncio.wait_for(hung.wait(), 10)
    clock.advance(seconds=300)
    report = await asyncio.wait_for(driving, 10)
    assert report.retrying == 1
    row = await row_of(store, run_id)
    assert (row.status, row.attempts) == ("running", 1)
    assert row.last_error is not None
    assert "300" in row.last_error
    assert report.errors[0].error == row.last_error

    # Not wedged: the next drive runs the run again, replaying the finished step.
    report = await drive(store, registry, clock, pass_timeout_s=300)
    assert report.advanced == 1
    row = await row_of(store, run_id)
    assert (row.cursor, row.attempts, row.last_error) == ("1", 0, None)


async def test_a_handlers_own_timeout_error_is_reported_as_itself(
    store: Any, clock: FakeClock
) -> None:
    def times_out(_p: jobrun.JobPass) -> None:
        raise TimeoutError("upstream timed out")

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(times_out), clock, pass_timeout_s=5)
    assert report.retrying == 1
    assert (await row_of(store, run_id)).last_error == "TimeoutError: upstream timed out"


def test_an_error_text_of_exactly_the_cap_is_kept_whole_and_one_byte_more_is_cut() -> None:
    whole = "x" * MAX_ERROR_TEXT_BYTES
    assert cap_error_text(whole) == whole
    # 64 bytes are kept free for the note saying how much was cut.
    assert cap_error_text(whole + "y") == "x" * (MAX_ERROR_TEXT_BYTES - 64) + (
        " [... cut, 65 more bytes]"
    )


def test_the_keep_cursor_marker_reads_as_its_name() -> None:
    assert repr(jobrun.KEEP_CURSOR) == "KEEP_CURSOR"


async def test_a_failure_the_store_refuses_after_a_cancel_is_heard_as_superseded(
    store: Any, clock: FakeClock
) -> None:
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await jobrun.cancel_job_run(store, p.run.id, "stop it", clock=clock)
        raise RuntimeError("after the cancel")

    observer = PassEnds()
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
    registry.register("m", "j", done_at_once, lease_ms=1000, max_takeovers=0)
    assert await claim_as(store, clock, "DEAD-0") is not None
    clock.advance(seconds=5)
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).failed == 1
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.updated_at == record.ended_at == clock()
