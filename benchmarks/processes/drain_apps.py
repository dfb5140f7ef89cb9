"""The drain scenario's jobs: one trivial job per system.

jobrun's worker is its real CLI (``python -m jobrun worker --app
benchmarks.processes.drain_apps:registry``); its job ``bench/drain`` makes one step
and is done. The peers' workers run in :mod:`benchmarks.processes.drain_peer`.
Procrastinate is imported only when asked for (the ``bench`` extra).
"""

from __future__ import annotations

from typing import Any

import jobrun

JOBRUN_JOB = ("bench", "drain")
PGQUEUER_ENTRYPOINT = "drain"
PROCRASTINATE_TASK = "bench.drain"

registry = jobrun.JobRegistry()


@registry.job(*JOBRUN_JOB)
async def drain(p: jobrun.JobPass) -> jobrun.PassResult:
    await p.step("one", lambda: 1)
    return jobrun.PassResult(done=True)


def procrastinate_app(conninfo: str) -> Any:
    """A Procrastinate app on ``conninfo`` (libpq form) with the trivial task."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name=PROCRASTINATE_TASK)
    async def trivial(index: int) -> int:
        return index

    return app
