"""A step's ``timeout_s`` (issue 34 item 6): a body past its time is cancelled and its
attempt fails like any other, retried by the step's policy.

Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture). The
bodies that must overrun wait on an event nobody sets, so no test depends on how fast
a loaded machine runs; the timeouts are real seconds (as ``pass_timeout_s``), short
ones, since the body never ends by itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import jobrun
from jobrun.testing import FakeClock
from tests.support import drive, registry_for, row_of, start_id

IMMEDIATE = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=0, max_delay_ms=0)


async def test_a_body_past_its_timeout_is_a_failed_attempt_then_retried(
    store: Any, clock: FakeClock
) -> None:
    attempts: list[int] = []
    cancelled: list[int] = []

    async def fetch() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            try:
                await asyncio.Event().wait()  # an upstream that never answers
            except asyncio.CancelledError:
                cancelled.append(len(attempts))
                raise
        return "page"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fetch", fetch, retry=IMMEDIATE, timeout_s=0.05)
        return jobrun.PassResult(done=True)

    registry = registry_for(handler)
    run_id = await start_id(store, clock)
    first = await drive(store, registry, clock)
    assert first.retrying == 1
    assert cancelled == [1]  # the body itself was cancelled, not left running
    row = await row_of(store, run_id)
    assert row.last_error == "step 'fetch' timed out after 0.05 s"
    ledger = await store.steps(run_id)
    assert (ledger["fetch"].attempts, ledger["fetch"].last_error) == (1, "timed out after 0.05 s")
    second = await drive(store, registry, clock)
    assert second.completed == 1
    assert attempts == [1, 2]
    assert (await store.steps(run_id)) == {}  # the commit dropped the ledger


async def test_the_step_raises_step_timeout_error_a_step_failed_error(
    store: Any, clock: FakeClock
) -> None:
    caught: list[BaseException] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        try:
            await p.step("slow", asyncio.Event().wait, retry=IMMEDIATE, timeout_s=0.02)
        except jobrun.StepFailedError as error:
            caught.append(error)
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)
    assert report.completed == 1  # the handler caught it and went on
    (error,) = caught
    assert isinstance(error, jobrun.StepTimeoutError)
    assert (error.code, error.step, error.attempts, error.timeout_s) == (
        "step_timeout",
        "slow",
        1,
        0.02,
    )
    assert str(error) == "step 'slow' timed out after 0.02 s"
    assert (await row_of(store, run_id)).status == "done"


async def test_spent_timeouts_fail_the_run_with_the_timeout_as_its_error(
    store: Any, clock: FakeClock
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        policy = jobrun.RetryPolicy(max_attempts=2, base_delay_ms=0, max_delay_ms=0)
        await p.step("slow", asyncio.Event().wait, retry=policy, timeout_s=0.02)
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    registry = registry_for(handler)
    outcomes = []
    for _ in range(2):
        report = await drive(store, registry, clock)
        outcomes.append("failed" if report.failed else "retrying" if report.retrying else "?")
    assert outcomes == ["retrying", "failed"]
    row = await row_of(store, run_id)
    assert (row.status, row.last_error) == ("failed", "step 'slow' timed out after 0.02 s")


async def test_a_timeout_error_the_body_raises_itself_is_its_own_failure(
    store: Any, clock: FakeClock
) -> None:
    async def body() -> None:
        raise TimeoutError("upstream said 504")

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fetch", body, retry=IMMEDIATE, timeout_s=30)
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    assert (await drive(store, registry_for(handler), clock)).retrying == 1
    # Told apart from the step's own timeout: the body's error, as it raised it.
    row = await row_of(store, run_id)
    assert row.last_error == "step 'fetch' failed: TimeoutError: upstream said 504"


async def test_a_synchronous_body_cannot_be_interrupted_and_its_result_counts(
    store: Any, clock: FakeClock
) -> None:
    def blocking() -> str:
        # Holds the event loop longer than the timeout: nothing can cancel it.
        time.sleep(0.1)
        return "done anyway"

    seen: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(await p.step("sync", blocking, retry=IMMEDIATE, timeout_s=0.01))
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    assert (await drive(store, registry_for(handler), clock)).completed == 1
    assert seen == ["done anyway"]
    assert (await row_of(store, run_id)).last_error is None


async def test_map_gives_each_item_its_own_timeout(store: Any, clock: FakeClock) -> None:
    calls: dict[int, int] = {}

    async def fetch(item: int) -> int:
        calls[item] = calls.get(item, 0) + 1
        if item == 2 and calls[item] == 1:
            await asyncio.Event().wait()
        return item * 10

    results: list[list[int]] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        mapped = await p.map(
            fetch, [1, 2, 3], name=lambda item: f"item-{item}", retry=IMMEDIATE, timeout_s=0.05
        )
        results.append(mapped)
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    registry = registry_for(handler)
    assert (await drive(store, registry, clock)).retrying == 1
    assert (await row_of(store, run_id)).last_error == "step 'item-2' timed out after 0.05 s"
    assert (await drive(store, registry, clock)).completed == 1
    assert results == [[10, 20, 30]]
    assert calls == {1: 1, 2: 2, 3: 1}  # only the item that timed out ran again


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
async def test_a_bad_timeout_is_the_handlers_mistake(
    store: Any, clock: FakeClock, bad: object
) -> None:
    calls: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("s", lambda: calls.append("ran"), timeout_s=bad)  # type: ignore[arg-type]
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    assert (await drive(store, registry_for(handler), clock)).failed == 1  # at once
    row = await row_of(store, run_id)
    assert row.last_error is not None
    assert row.last_error.startswith("step 's': timeout_s must be"), row.last_error
    assert calls == []  # refused before the body
