"""Contract tests for steps run side by side: ``p.map`` and ``asyncio.gather`` over ``p.step``.

Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture).
No timing: concurrency is seen by counting the bodies running at once, and
bodies that must overlap wait on each other through events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.model.records import StepRow
from jobrun.testing import FakeClock
from tests.support import RecordingStore, drive, iso, registry_for, row_of, start_id

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0)


class Crash(BaseException):
    """Stands for the process dying in a body: the pass stops, nothing more recorded."""


class Bodies:
    """Step bodies that count their calls and the most of them running at once.

    The first ``overlap`` bodies wait until that many are running, so a map that
    runs fewer at once would hang (and time out) instead of passing by luck.
    """

    def __init__(self, overlap: int = 1) -> None:
        self.calls: dict[int, int] = {}
        self.running = 0
        self.most = 0
        self.overlap = overlap
        self.all_in = asyncio.Event()

    async def enter(self, item: int) -> None:
        self.calls[item] = self.calls.get(item, 0) + 1
        self.running += 1
        self.most = max(self.most, self.running)
        if self.running >= self.overlap:
            self.all_in.set()
        await self.all_in.wait()

    async def square(self, item: int) -> int:
        await self.enter(item)
        await asyncio.sleep(0)
        self.running -= 1
        return item * item


def named(item: Any) -> str:
    return f"item-{item}"


# --- results, order, concurrency -----------------------------------------------


async def test_map_returns_results_in_item_order_running_at_most_concurrency_at_once(
    store: Any, clock: FakeClock
) -> None:
    bodies = Bodies(overlap=3)
    seen: list[list[int]] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        # A generator: read once.
        seen.append(await p.map(bodies.square, (i for i in range(10)), name=named, concurrency=3))
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)

    assert report.completed == 1
    assert seen == [[i * i for i in range(10)]]
    assert bodies.most == 3
    assert bodies.calls == dict.fromkeys(range(10), 1)
    assert (await row_of(store, run_id)).status == "done"


async def test_map_takes_sync_bodies_and_an_empty_list(store: Any, clock: FakeClock) -> None:
    seen: list[Any] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(await p.map(lambda item: {"twice": item * 2}, [3, 1, 2], name=named))
        seen.append(await p.map(lambda item: item, [], name=named))
        return jobrun.PassResult(done=True)

    await start_id(store, clock)
    assert (await drive(store, registry_for(handler), clock)).completed == 1
    assert seen == [[{"twice": 6}, {"twice": 2}, {"twice": 4}], []]


# --- durability: a pass killed half-way replays only unfinished items -----------


async def test_a_map_interrupted_half_way_replays_only_the_unfinished_items(
    store: Any, clock: FakeClock
) -> None:
    calls: dict[int, int] = {}
    finished_first: set[int] = set()
    results: list[list[int]] = []
    passes: list[int] = []
    counted = RecordingStore(store)

    async def body(item: int) -> int:
        calls[item] = calls.get(item, 0) + 1
        await asyncio.sleep(0)
        if item == 5 and calls[item] == 1:
            raise Crash
        if len(passes) == 1:
            finished_first.add(item)
        return item + 100

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append(1)
        results.append(await p.map(body, range(12), name=named, concurrency=3))
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    with pytest.raises(Crash):
        await drive(counted, registry_for(handler), clock)
    ledger = await store.steps(run_id)
    # Every body that returned is on the record; the crashed one and the rest are not.
    assert {name for name, row in ledger.items() if row.result is not None} == {
        named(item) for item in finished_first
    }
    assert named(5) not in ledger
    assert 5 < len(calls) < 12, "new items stopped after the crash"

    counted.calls.clear()
    report = await drive(counted, registry_for(handler), clock)
    assert report.completed == 1
    assert results == [[item + 100 for item in range(12)]]
    # Finished items were answered from the one ledger read, never called again.
    assert all(calls[item] == 1 for item in finished_first)
    assert calls[5] == 2
    assert set(calls) == set(range(12))
    assert counted.count("steps") == 1
    assert counted.count("record_step") == 12 - len(finished_first)


# --- the first failure -------------------------------------------------------------


async def test_the_first_failure_stops_new_items_and_fails_the_pass_as_its_step(
    store: Any, clock: FakeClock
) -> None:
    calls: list[int] = []
    item_1_failed = asyncio.Event()
    caught: list[BaseException] = []

    async def body(item: int) -> int:
        calls.append(item)
        if item == 0:
            # Still running when item 1 fails: it ends, and its failure is recorded too.
            await item_1_failed.wait()
            raise ValueError("second to fail")
        if item == 1:
            item_1_failed.set()
            raise RuntimeError("first to fail")
        return item

    async def handler(p: jobrun.JobPass) -> None:
        try:
            await p.map(body, range(6), name=named, concurrency=2)
        except BaseException as error:
            caught.append(error)
            raise

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler, jobrun.RetryPolicy(max_attempts=3)), clock)

    assert report.retrying == 1
    assert sorted(calls) == [0, 1], "no new item started after the first failure"
    (error,) = caught
    assert isinstance(error, jobrun.StepFailedError)
    assert (error.step, error.attempts) == ("item-1", 1)
    row = await row_of(store, run_id)
    assert row.last_error == "step 'item-1' failed: RuntimeError: first to fail"
    assert await store.steps(run_id) == {
        "item-0": StepRow("item-0", None, 1, "ValueError: second to fail"),
        "item-1": StepRow("item-1", None, 1, "RuntimeError: first to fail"),
    }


async def test_the_step_policy_given_to_map_judges_its_items(store: Any, clock: FakeClock) -> None:
    calls: list[int] = []

    def body(item: int) -> int:
        calls.append(item)
        raise RuntimeError("down")

    async def handler(p: jobrun.JobPass) -> None:
        await p.map(body, [7], name=named, retry=jobrun.RetryPolicy(max_attempts=2))

    # The job would allow 5 attempts with no wait; the items get the map's policy.
    registry = registry_for(handler, jobrun.RetryPolicy(max_attempts=5, base_delay_ms=0))
    run_id = await start_id(store, clock)

    assert (await drive(store, registry, clock)).retrying == 1
    row = await row_of(store, run_id)
    # The map's policy's default base delay (1000 ms; random 0.5 gives a factor of 1).
    assert row.next_attempt_at == iso(clock() + timedelta(milliseconds=1000))
    clock.advance(seconds=1)
    assert (await drive(store, registry, clock)).failed == 1
    assert calls == [7, 7]
    assert (await store.steps(run_id))["item-7"].attempts == 2


async def test_an_exit_in_a_map_body_is_recorded_then_raised_again(
    store: Any, clock: FakeClock
) -> None:
    def body(item: int) -> int:
        if item == 1:
            raise KeyboardInterrupt
        return item

    async def handler(p: jobrun.JobPass) -> None:
        await p.map(body, range(3), name=named, concurrency=1)

    run_id = await start_id(store, clock)
    with pytest.raises(KeyboardInterrupt):
        await drive(store, registry_for(handler, IMMEDIATE), clock)
    row = await row_of(store, run_id)
    assert (row.attempts, row.lease_owner) == (1, None)
    assert row.last_error == "step 'item-1' failed: KeyboardInterrupt raised by the step's code"
    assert set(await store.steps(run_id)) == {"item-0", "item-1"}


async def test_cancelling_the_pass_cancels_the_running_items(store: Any, clock: FakeClock) -> None:
    bodies = Bodies(overlap=2)
    ended: list[str] = []

    async def hangs(item: int) -> None:
        await bodies.enter(item)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append(f"cancelled {item}")
            raise

    async def handler(p: jobrun.JobPass) -> None:
        await p.map(hangs, range(5), name=named, concurrency=2)

    run_id = await start_id(store, clock)
    driving = asyncio.create_task(drive(store, registry_for(handler), clock))
    await bodies.all_in.wait()
    driving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await driving
    assert sorted(ended) == ["cancelled 0", "cancelled 1"]
    assert await store.steps(run_id) == {}
    row = await row_of(store, run_id)
    assert (row.attempts, row.lease_owner) == (0, None)


# --- mistakes ----------------------------------------------------------------------


def _call(**changes: Any) -> Callable[[jobrun.JobPass], Any]:
    """A ``p.map`` call with ``changes`` made to a good one."""
    arguments: dict[str, Any] = {"fn": lambda item: item, "items": [1, 2], "name": named}
    arguments.update(changes)
    return lambda p: p.map(arguments.pop("fn"), arguments.pop("items"), **arguments)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"concurrency": 0}, "concurrency=0): concurrency must be an int of at least 1"),
        ({"concurrency": True}, "concurrency=a bool)"),
        ({"concurrency": 2.0}, "concurrency=a float)"),
        ({"fn": "f"}, "fn must be callable, got str"),
        ({"name": "item"}, "name must be callable (item -> step name), got str"),
        ({"items": 5}, "items must be iterable, got int"),
        ({"items": "abc"}, "items is a str; pass a list of items"),
        ({"name": lambda item: item}, "name(item) must return a str, got int for item 0"),
        ({"name": lambda item: ""}, "step name '' of item 0 is empty"),
        ({"retry": 3}, "retry must be a RetryPolicy, got int"),
        ({"concurrency_limit": 3}, "give a str, or a callable item -> str, got int"),
        ({"concurrency_limit": lambda item: item}, "must return a str, got int for item 0"),
    ],
    ids=[
        "concurrency-0",
        "concurrency-bool",
        "concurrency-float",
        "fn",
        "name",
        "items-int",
        "items-str",
        "name-returns-int",
        "name-empty",
        "retry",
        "concurrency-limit",
        "concurrency-limit-returns-int",
    ],
)
async def test_a_mistaken_map_call_fails_the_run_at_once_with_nothing_run(
    store: Any, clock: FakeClock, changes: dict[str, Any], expected: str
) -> None:
    calls: list[Any] = []
    caught: list[BaseException] = []

    async def handler(p: jobrun.JobPass) -> None:
        await p.step("before", lambda: "kept")
        try:
            await _call(**({"fn": calls.append} | changes))(p)
        except BaseException as error:
            caught.append(error)
            raise

    run_id = await start_id(store, clock)
    report = await drive(store, registry_for(handler), clock)

    (error,) = caught
    assert isinstance(error, jobrun.HandlerMistakeError)
    assert expected in str(error)
    assert report.failed == 1
    assert calls == []
    assert set(await store.steps(run_id)) == {"before"}


@pytest.mark.parametrize("items", [["a", "b", "a"], ["before", "c"]], ids=["twice", "used"])
async def test_a_name_used_twice_raises_step_reused_before_any_item_runs(
    store: Any, clock: FakeClock, items: list[str]
) -> None:
    calls: list[str] = []
    caught: list[BaseException] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("before", lambda: 1)
        try:
            await p.map(calls.append, items, name=str)
        except jobrun.StepReusedError as error:
            caught.append(error)
        return jobrun.PassResult()

    await start_id(store, clock)
    assert (await drive(store, registry_for(handler), clock)).advanced == 1
    (error,) = caught
    assert error.step == ("a" if items[0] == "a" else "before")
    assert calls == []


# --- asyncio.gather over p.step ------------------------------------------------------


async def test_steps_gathered_run_side_by_side_each_durable_and_replayed(
    store: Any, clock: FakeClock
) -> None:
    bodies = Bodies(overlap=3)
    seen: list[list[int]] = []
    counted = RecordingStore(store)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        gathered = await asyncio.gather(
            *(p.step(f"s{item}", lambda item=item: bodies.square(item)) for item in (4, 5, 6))
        )
        seen.append(list(gathered))
        if len(seen) == 1:
            raise RuntimeError("replay next")
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    await drive(counted, registry_for(handler, IMMEDIATE), clock)
    assert bodies.most == 3
    # Three steps started together share the pass's one ledger read (none at all
    # when the claim knew the fresh run's ledger empty, as the Postgres claim does).
    first_claim = counted.results["claim"][0]
    assert counted.count("steps") == (0 if first_claim.ledger_empty else 1)
    ledger = await store.steps(run_id)
    assert {name: row.result for name, row in ledger.items()} == {
        "s4": "16",
        "s5": "25",
        "s6": "36",
    }

    counted.calls.clear()
    assert (await drive(counted, registry_for(handler, IMMEDIATE), clock)).completed == 1
    assert seen == [[16, 25, 36], [16, 25, 36]]
    assert bodies.calls == {4: 1, 5: 1, 6: 1}
    assert (counted.count("steps"), counted.count("record_step")) == (1, 0)
