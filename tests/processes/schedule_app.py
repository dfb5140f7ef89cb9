"""A registry for the schedule and retention worker tests.

Used as ``--app tests.processes.schedule_app:registry``.

* ``clock/every2s``: scheduled every two seconds; each run is done in one pass.
* ``clock/limited``: at most two runs leased at once; a pass sleeps ``payload["sleep_s"]``.
* ``clock/kept``: kept for a day after it ends (``keep_for``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import jobrun

registry = jobrun.JobRegistry()

in_flight = 0
most_in_flight = 0


@registry.job("clock", "every2s")
async def every2s(p: jobrun.JobPass) -> jobrun.PassResult:
    return jobrun.PassResult(done=True)


registry.schedule("clock", "every2s", "* * * * * */2", payload={"from": "schedule"})


@registry.job("clock", "limited", max_concurrent=2)
async def limited(p: jobrun.JobPass) -> jobrun.PassResult:
    global in_flight, most_in_flight
    in_flight += 1
    most_in_flight = max(most_in_flight, in_flight)
    try:
        # sleep: the pass's work, long enough for passes to overlap
        await asyncio.sleep(p.payload["sleep_s"])
    finally:
        in_flight -= 1
    return jobrun.PassResult(done=True)


@registry.job("clock", "kept", keep_for=timedelta(days=1))
async def kept(p: jobrun.JobPass) -> jobrun.PassResult:
    return jobrun.PassResult(done=True)
