"""Fair claims (memory, SQLite, Postgres): a low-priority run is claimed within the
documented number of claims however much higher-priority work keeps arriving."""

from __future__ import annotations

from typing import Any

import jobrun
from jobrun._core.model.formats import format_instant
from jobrun._core.rules.fair_turns import FAIR_EVERY
from jobrun.testing import FakeClock
from tests.support import drive, start

KEY = ("crm", "import")
HIGH, LOW = 10, 0
# Priority-10 runs due before the priority-0 run, and kept due all along.
AHEAD = 5


async def test_a_low_priority_run_is_claimed_within_the_bound_under_sustained_load(
    store: Any, clock: FakeClock
) -> None:
    claimed: list[str] = []
    started = AHEAD
    registry = jobrun.JobRegistry()

    @registry.job(*KEY)
    async def work(p: jobrun.JobPass) -> jobrun.PassResult:
        nonlocal started
        claimed.append(p.run.instance)
        clock.advance(milliseconds=1)
        if p.run.instance != "low":
            # Sustained load: each high-priority run that finishes brings a new one.
            started += 1
            await start(store, clock, instance=f"high-{started}", priority=HIGH)
        return jobrun.PassResult(done=True)

    for number in range(AHEAD):
        await start(store, clock, instance=f"high-{number}", priority=HIGH)
        clock.advance(milliseconds=1)
    await start(store, clock, instance="low", priority=LOW)
    clock.advance(milliseconds=1)

    # Small drives (fewer claims than FAIR_EVERY each): the count carries over.
    bound = FAIR_EVERY * (AHEAD + 1)
    while "low" not in claimed and len(claimed) < 10 * bound:
        report = await drive(store, registry, clock, limit=3)
        assert report.completed == report.attempted > 0
        due = await store.due_by_job(format_instant(clock.now()))
        assert due[KEY] >= AHEAD, "higher-priority runs were due at every claim"

    assert "low" in claimed, "the priority-0 run starved"
    position = claimed.index("low") + 1
    assert position <= bound
    # It was taken by a claim that goes by age: every other claim took priority 10.
    assert position % FAIR_EVERY == 0
    assert all(instance.startswith("high-") for instance in claimed[: position - 1])
