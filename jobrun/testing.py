"""A testing kit for code that uses jobrun: a fake clock, stores, drive-until-idle, crashes.

    clock = FakeClock()
    store = MemoryJobRunStore()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    await jobrun.run_due_jobs(store, registry, clock=clock)
    clock.advance(seconds=5)

    report = await drive_until_idle(store, registry, clock=clock, crash=crash_after_step(2))
    assert report.passes[-1].memo_hits() == ["fetch", "save"]

``FakeClock`` drives the engine's waits too (lease renewal, the pass budget);
``FakeClock(autojump=True)`` jumps to the next deadline whenever every task waits.
The fixtures of ``jobrun.pytest_plugin`` wrap these for pytest.

The memory store keeps the same contract as ``SqlJobRunStore`` (one live run per
key, atomic pass commits) and applies the same decisions (``jobrun._core.leases.claims``
chooses what a claim gets and writes, ``jobrun._core.rules.transitions`` builds every
other state change), so a handler tested against it behaves the same on a database.
It is not durable and not shared between processes.
"""

from __future__ import annotations

from jobrun._testing.clock import FakeClock
from jobrun._testing.crash import CrashAfter, CrashingStore, SimulatedCrash, crash_after_step
from jobrun._testing.idle import IdleReport, PassRecord, drive_until_idle
from jobrun._testing.memory import MemoryJobRunStore
from jobrun._testing.stores import sqlite_store

__all__ = [
    "CrashAfter",
    "CrashingStore",
    "FakeClock",
    "IdleReport",
    "MemoryJobRunStore",
    "PassRecord",
    "SimulatedCrash",
    "crash_after_step",
    "drive_until_idle",
    "sqlite_store",
]
