"""The idle survivor (issue 31 item 1): kill -9 the holder of the only run while the
other drivers, ``run_worker`` processes as ``jobrun worker`` runs them, are idle.

Unlike the other scenarios, the drivers are workers with the library's defaults,
lease included (a minute): an idle worker sleeps until its database's next due
instant, and a leased run is due only when its lease expires, so a survivor that
did not look for the holder's death would wait out the lease. On other hosts
(Postgres only: each driver claims as if on a machine of its own, where ``/proc``
proves nothing), the presence lock is the proof, after its grace period.
"""

from __future__ import annotations

import asyncio
import signal
import time

from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.chaos.stage import Fault, Stage

# The library's default lease: what a deployment that sets nothing has.
DEFAULT_LEASE_MS = 60_000
# About 0.45 s a pass: struck in its second pass, the run has a few seconds left.
PASSES = 8
# A settling look after the drivers are ready, so that they have fallen idle.
SETTLE_S = 0.5


class IdleSurvivor(Fault):
    # No run at first: the fault starts the one run once every driver is idle, so
    # whichever claims it is the holder and the other two are idle survivors.
    runs, passes, lease_ms, worker_drivers = 0, PASSES, DEFAULT_LEASE_MS, True
    # Resumed on proof of death, not at the lease's expiry (lateness against the lease).
    resume_within_s = DEFAULT_LEASE_MS / 2000
    # The drivers' own deadline: room for a lease waited out, so that a regression
    # shows as a slow resume rather than a lost run.
    deadline_s = 150.0

    def __init__(self, elsewhere: bool = False) -> None:
        self.elsewhere = elsewhere
        where = " (survivors on another host)" if elsewhere else ""
        self.name = f"idle survivor: kill -9 the only holder{where}"
        self.backends = ("postgres",) if elsewhere else ("sqlite", "postgres")
        self.case_id = "IdleSurvivorElsewhere" if elsewhere else "IdleSurvivor"
        self.quick = True

    async def before_drivers(self, stage: Stage) -> None:
        if self.elsewhere:
            # Each driver on a machine of its own (whichever claims the run, the
            # others cannot judge it by pid): only the presence can prove its death.
            for index in range(3):
                stage.driver_env[index] = {"JOBRUN_CHAOS_MACHINE": f"machine-{index}"}

    async def inject(self, stage: Stage) -> None:
        # sleep: the drivers, ready, fall idle (a driver still starting would take the
        # run at its first claim: the same outcome, another scenario)
        await asyncio.sleep(SETTLE_S)
        engine = create_async_engine(stage.url)
        try:
            store = jobrun.SqlJobRunStore(engine)
            await jobrun.start_job_run(store, module_id="chaos", job="walk", instance="r0")
        finally:
            await engine.dispose()
        victim, event = await stage.victim_body()
        victim.process.send_signal(signal.SIGKILL)
        stage.deaths[victim.process.pid] = stage.resume_from_ns = time.monotonic_ns()
        stage.affected_runs = {event["run"]}
        stage.notes.append(
            f"run_worker drivers, library defaults (lease {self.lease_ms // 1000} s); "
            f"1 run of {self.passes} passes, started once they were idle; "
            f"killed in {event['step']}"
        )
