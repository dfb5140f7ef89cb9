"""``p.map``: one step per item, at most ``concurrency`` at once, results in item order.

Two halves. :func:`plan_map` is pure: it checks the call, materialises the items
once and names every step before anything runs, so a bad name or a name used
twice fails the call with no body started. :func:`run_map` then runs the plan
on a fixed number of worker tasks pulling from one iterator (a 100,000-item map
makes ``concurrency`` tasks, not 100,000), each item through ``p.step``, so
every item is its own durable step and a replay answers the finished ones from
the ledger.

The first item to raise stops the map from starting new items; the running ones
finish (and ``p.step`` records them, failures included), then that first
exception is raised, so the pass fails exactly as that step's failure would
(its attempts and policy drive the backoff). A cancellation of the pass (lease
lost, budget spent, the host stopping) cancels the running items, waits for
them to end, and goes on: no body outlives the pass that started it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jobrun._core.model.names import name_problem, shown_name
from jobrun._core.model.refusals import is_int, mistake, type_name
from jobrun._core.rules.retry import RetryPolicy
from jobrun.errors import StepReusedError

__all__ = ["DEFAULT_CONCURRENCY", "MapPlan", "PlannedStep", "plan_map", "run_map"]

# Enough to hide most of an I/O body's latency without flooding whatever the
# bodies call; a map that wants more (or fewer) says so.
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """One item's step: its name, its body (``fn`` bound to the item), and what
    ``p.step`` gets besides (only the options the map was given)."""

    name: str
    body: Callable[[], Any]
    options: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class MapPlan:
    """Every item's step, in item order, and how many may run at once."""

    steps: list[PlannedStep]
    concurrency: int


def plan_map(
    fn: object,
    items: object,
    *,
    name: object,
    concurrency: object,
    retry: object,
    rate_limit: object,
    concurrency_limit: object,
    used: Collection[str],
    timeout_s: float | None = None,
) -> MapPlan:
    """Check a ``p.map`` call and name every item's step; nothing runs yet.

    ``used`` holds the step names this pass has already called: a name among
    them, or one two items share, raises ``StepReusedError`` as ``p.step`` would,
    before any body starts. ``name(item)`` and a callable ``concurrency_limit``
    are called here, once per item, in item order.
    """
    fn, name, concurrency = _checked_call(fn, name, concurrency, retry, concurrency_limit)
    materialised = _materialised(items)
    seen: set[str] = set()
    steps: list[PlannedStep] = []
    for index, item in enumerate(materialised):
        step_name = _step_name(name(item), index)
        if step_name in seen or step_name in used:
            raise StepReusedError(step_name)
        seen.add(step_name)
        options = _options(retry, rate_limit, concurrency_limit, item, index)
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
        steps.append(PlannedStep(step_name, functools.partial(fn, item), options))
    return MapPlan(steps, concurrency)


def _checked_call(
    fn: object, name: object, concurrency: object, retry: object, concurrency_limit: object
) -> tuple[Callable[[Any], Any], Callable[[Any], object], int]:
    """``fn``, ``name`` and ``concurrency`` once checked; the other options checked too."""
    if not callable(fn):
        raise mistake("map", f"p.map(fn, ...): fn must be callable, got {type_name(fn)}")
    if not callable(name):
        raise mistake(
            "map",
            f"p.map(..., name=...): name must be callable (item -> step name), got "
            f"{type_name(name)}",
        )
    if not is_int(concurrency) or concurrency < 1:
        shown = repr(concurrency) if is_int(concurrency) else f"a {type_name(concurrency)}"
        raise mistake(
            "map", f"p.map(..., concurrency={shown}): concurrency must be an int of at least 1"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise mistake(
            "map", f"p.map(..., retry=...): retry must be a RetryPolicy, got {type_name(retry)}"
        )
    if concurrency_limit is not None and not (
        isinstance(concurrency_limit, str) or callable(concurrency_limit)
    ):
        raise mistake(
            "map",
            "p.map(..., concurrency_limit=...): give a str, or a callable item -> str, got "
            f"{type_name(concurrency_limit)}",
        )
    return fn, name, concurrency


def _materialised(items: object) -> list[Any]:
    """The items as a list, read once (a generator is fine)."""
    if isinstance(items, str | bytes | bytearray):
        # Iterable, but a map over characters is almost always a mistake.
        raise mistake(
            "map", f"p.map(fn, items): items is a {type_name(items)}; pass a list of items"
        )
    if not isinstance(items, Iterable):
        raise mistake("map", f"p.map(fn, items): items must be iterable, got {type_name(items)}")
    return list(items)


def _step_name(named: object, index: int) -> str:
    if not isinstance(named, str):
        raise mistake(
            "map",
            f"p.map: name(item) must return a str, got {type_name(named)} for item {index}",
        )
    problem = name_problem(named)
    if problem is not None:
        raise mistake("map", f"p.map: step name {shown_name(named)} of item {index} {problem}")
    return named


def _options(
    retry: object, rate_limit: object, concurrency_limit: object, item: Any, index: int
) -> dict[str, Any]:
    """What ``p.step`` gets besides name and body: only what the map was given."""
    options: dict[str, Any] = {}
    if retry is not None:
        options["retry"] = retry
    if rate_limit is not None:
        options["rate_limit"] = rate_limit
    if concurrency_limit is not None:
        key = concurrency_limit
        if callable(key):
            key = key(item)
            if not isinstance(key, str):
                raise mistake(
                    "map",
                    "p.map: concurrency_limit(item) must return a str, got "
                    f"{type_name(key)} for item {index}",
                )
        options["concurrency_limit"] = key
    return options


async def run_map(step: Callable[..., Awaitable[Any]], plan: MapPlan) -> list[Any]:
    """Run every planned step through ``step`` (``p.step``); their results in item order.

    Raises the first exception an item raised, once every item already running
    has ended; a cancellation cancels the running items, waits for them, and goes on.
    """
    results: list[Any] = [None] * len(plan.steps)
    if not plan.steps:
        return results
    # Shared by the workers: each takes the next item when it is free.
    pending = iter(enumerate(plan.steps))
    failures: list[BaseException] = []

    async def worker() -> None:
        for index, planned in pending:
            if failures:
                return
            try:
                results[index] = await step(planned.name, planned.body, **planned.options)
            except BaseException as error:
                task = asyncio.current_task()
                if isinstance(error, asyncio.CancelledError) and task and task.cancelling():
                    raise
                # Kept, not raised here: out of a task of its own, a KeyboardInterrupt
                # or SystemExit would stop the event loop. Raised in the pass's task.
                failures.append(error)
                return

    workers = [asyncio.create_task(worker()) for _ in range(min(plan.concurrency, len(results)))]
    try:
        await asyncio.wait(workers)
    except asyncio.CancelledError:
        for running in workers:
            running.cancel()
        # The bodies end before the pass does, so none outlives the lease.
        await asyncio.wait(workers)
        raise
    if failures:
        raise failures[0]
    return results
