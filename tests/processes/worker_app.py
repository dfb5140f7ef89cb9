"""A small job registry for the worker tests (``--app tests.processes.worker_app:registry``).

* ``demo/pages``: ``payload["pages"]`` passes, one step each, then done.
* ``demo/slow``: one pass whose step sleeps ``payload["sleep_s"]`` seconds, then done.
* ``demo/concurrent``: one pass that records how many of its kind run at once.
* ``demo/poison``: a step that raises ``payload["raise"]`` (``CancelledError``,
  ``KeyboardInterrupt`` or ``SystemExit``) on each of its two attempts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jobrun

registry = jobrun.JobRegistry()

in_flight = 0
most_in_flight = 0


@registry.job("demo", "pages", retry=jobrun.RetryPolicy(max_attempts=3, base_delay_ms=0))
async def pages(p: jobrun.JobPass) -> jobrun.PassResult:
    page = p.cursor or 0
    await p.step(f"page-{page}", lambda: page * 10)
    p.count("pages")
    return jobrun.PassResult(cursor=page + 1, done=page + 1 >= p.payload["pages"])


@registry.job("demo", "slow")
async def slow(p: jobrun.JobPass) -> jobrun.PassResult:
    async def nap() -> str:
        # sleep: the step's work, as long as the test asks
        await asyncio.sleep(p.payload["sleep_s"])
        return "rested"

    await p.step("nap", nap)
    return jobrun.PassResult(done=True)


@registry.job("demo", "concurrent")
async def concurrent(p: jobrun.JobPass) -> dict[str, Any]:
    global in_flight, most_in_flight
    in_flight += 1
    most_in_flight = max(most_in_flight, in_flight)
    try:
        # sleep: the pass's work, long enough for passes to overlap
        await asyncio.sleep(p.payload.get("sleep_s", 0.1))
    finally:
        in_flight -= 1
    return {"done": True}


POISONS: dict[str, BaseException] = {
    "cancelled": asyncio.CancelledError(),
    "keyboard": KeyboardInterrupt(),
    "exit": SystemExit(3),
}


@registry.job("demo", "poison", retry=jobrun.RetryPolicy(max_attempts=2, base_delay_ms=0))
async def poison(p: jobrun.JobPass) -> jobrun.PassResult:
    def swallowed() -> None:
        raise POISONS[p.payload["raise"]]

    await p.step("poison", swallowed)
    return jobrun.PassResult(done=True)
