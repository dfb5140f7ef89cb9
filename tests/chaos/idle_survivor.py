"""The idle survivor (issue 31 item 1): kill -9 the holder of the only run while the
other drivers, ``run_worker`` processes as ``jobrun worker`` runs them, are idle.

Unlike the other scenarios, the drivers are workers with the library's defaults,
lease included (a minute): an idle worker sleeps until its database's next due
instant, and a leased run is due only when its lease expires, so a survivor that
did not look for the holder's death would wait out the lease. On another host
(Postgres only: the survivors claim as if on another machine, where ``/proc``
proves nothing), the presence lock is the proof, after its grace period.
"""

from __future__ import annotations

import asyncio
import signal
import time

from tests.chaos.stage import Fault, Stage

# The library's default lease: what a deployment that sets nothing has.
DEFAULT_LEASE_MS = 60_000
# Long enough a run (about 0.45 s a pass) that the survivors are up and idle before
# the holder is struck in one of its middle passes.
PASSES = 30
# A settling look after the survivors are ready, so that they have fallen idle.
SETTLE_S = 1.0


class IdleSurvivor(Fault):
    runs, passes, lease_ms, worker_drivers = 1, PASSES, DEFAULT_LEASE_MS, True
    first_driver_alone = True
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
            for survivor in (1, 2):
                stage.driver_env[survivor] = {"JOBRUN_CHAOS_FOREIGN": "1"}

    async def inject(self, stage: Stage) -> None:
        # sleep: the survivors, ready, fall idle (a survivor still starting would take
        # the run at its first claim: the same outcome, another scenario)
        await asyncio.sleep(SETTLE_S)
        victim, event = await stage.victim_body(only=stage.children[0])
        victim.process.send_signal(signal.SIGKILL)
        stage.deaths[victim.process.pid] = stage.resume_from_ns = time.monotonic_ns()
        stage.affected_runs = {event["run"]}
        stage.notes.append(
            f"run_worker drivers, library defaults (lease {self.lease_ms // 1000} s); "
            f"1 run of {self.passes} passes; killed in {event['step']}"
        )
