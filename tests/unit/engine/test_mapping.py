"""``p.map``'s pure half (the plan) and its runner over a stand-in ``p.step``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import jobrun
from jobrun._core.engine.mapping import DEFAULT_CONCURRENCY, MapPlan, PlannedStep, plan_map, run_map


def plan(items: Any, **changes: Any) -> MapPlan:
    arguments: dict[str, Any] = {
        "name": lambda item: f"n{item}",
        "concurrency": DEFAULT_CONCURRENCY,
        "retry": None,
        "rate_limit": None,
        "concurrency_limit": None,
        "used": (),
    }
    arguments.update(changes)
    return plan_map(lambda item: item * 10, items, **arguments)


def test_the_plan_names_every_item_in_order_and_binds_fn_to_it() -> None:
    planned = plan(item for item in (3, 1, 2))
    assert [step.name for step in planned.steps] == ["n3", "n1", "n2"]
    assert [step.body() for step in planned.steps] == [30, 10, 20]
    assert planned.concurrency == DEFAULT_CONCURRENCY


def test_only_the_options_given_go_to_the_step() -> None:
    policy = jobrun.RetryPolicy(max_attempts=2)
    assert [step.options for step in plan([1]).steps] == [{}]
    planned = plan([1, 2], retry=policy, rate_limit="limit", concurrency_limit=lambda i: f"k{i}")
    assert [step.options for step in planned.steps] == [
        {"retry": policy, "rate_limit": "limit", "concurrency_limit": "k1"},
        {"retry": policy, "rate_limit": "limit", "concurrency_limit": "k2"},
    ]
    assert plan([1], concurrency_limit="shared").steps[0].options == {"concurrency_limit": "shared"}


def test_a_name_used_twice_or_already_used_is_refused() -> None:
    with pytest.raises(jobrun.StepReusedError) as twice:
        plan([1, 2, 1])
    assert twice.value.step == "n1"
    with pytest.raises(jobrun.StepReusedError):
        plan([1], used={"n1"})


def steps(count: int) -> list[PlannedStep]:
    return [PlannedStep(f"s{index}", lambda index=index: index, {}) for index in range(count)]


async def test_the_runner_keeps_item_order_on_a_bounded_number_of_workers() -> None:
    running, most = 0, 0

    async def step(name: str, body: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        # Later items finish first: the order of results is the items', not the finish's.
        for _ in range(100 - body()):
            await asyncio.sleep(0)
        running -= 1
        return name

    tasks_before = len(asyncio.all_tasks())
    results = await run_map(step, MapPlan(steps(50), 4))
    assert results == [f"s{index}" for index in range(50)]
    assert most == 4
    assert len(asyncio.all_tasks()) == tasks_before


async def test_the_runner_raises_the_first_failure_once_the_running_items_end() -> None:
    started: list[str] = []
    ended: list[str] = []
    first_failed = asyncio.Event()

    async def step(name: str, body: Any) -> Any:
        started.append(name)
        if name == "s0":
            await first_failed.wait()
            ended.append(name)
            raise ValueError("later")
        first_failed.set()
        raise KeyError("first")

    with pytest.raises(KeyError):
        await run_map(step, MapPlan(steps(10), 2))
    assert started == ["s0", "s1"]
    assert ended == ["s0"]
