"""The registry of the idle-survivor tests (``jobrun worker --app ...survivor_app:registry``).

``survivor/walk`` has the library's default lease (a minute) and one step per pass.
Each body appends ``<pid> <time.time()> <run id>`` to the file named by
``JOBRUN_SURVIVOR_LOG`` (one ``write``, ``O_APPEND``: lines stay whole) when it
starts; with ``JOBRUN_SURVIVOR_HANG=1`` the body then sleeps for an hour, so the
process holds the run until it is killed.

``JOBRUN_SURVIVOR_FOREIGN=1`` makes the process claim and judge as if it ran on
another machine (a boot id of its own): ``/proc`` proves nothing to it, so only
what the database knows (Postgres: the presence lock) can prove a death.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import jobrun
from jobrun._host import system as _system

MODULE, JOB = "survivor", "walk"

if os.environ.get("JOBRUN_SURVIVOR_FOREIGN") == "1":
    _elsewhere = replace(_system.local_identity(), host="elsewhere", boot="another-machine")
    # Both the claim (who we are) and the proof (who is here) see the other machine.
    _system.local_identity = lambda: _elsewhere  # type: ignore[assignment]

registry = jobrun.JobRegistry()


@registry.job(MODULE, JOB)
async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
    async def body() -> str:
        line = f"{os.getpid()} {time.time():.6f} {p.run.id}\n"
        descriptor = os.open(
            os.environ["JOBRUN_SURVIVOR_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)
        if os.environ.get("JOBRUN_SURVIVOR_HANG") == "1":
            # sleep: a body that runs until its process is killed
            await asyncio.sleep(3600)
        return "walked"

    await p.step("walk", body)
    return jobrun.PassResult(done=True)
