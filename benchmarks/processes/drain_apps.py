"""The drain scenario's workers: one trivial job per system, and the child process that
runs PgQueuer's or Procrastinate's own worker on a database.

jobrun's worker is its real CLI (``python -m jobrun worker --app
benchmarks.processes.drain_apps:registry``); its job ``bench/drain`` makes one step
and is done. The peers run here, as ``python -m benchmarks.processes.drain_apps
SYSTEM URL``, with their own worker loop and defaults: PgQueuer's
``QueueManager.run`` (entrypoint ``drain``) and Procrastinate's ``run_worker_async``
(task ``bench.drain``). Both are imported only when asked for (the ``bench`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
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


async def _run_pgqueuer(conninfo: str, stop: asyncio.Event) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(conninfo)
    manager = QueueManager(Queries.from_asyncpg_connection(connection))

    @manager.entrypoint(PGQUEUER_ENTRYPOINT)
    async def trivial(job: Any) -> None:
        return None

    running = asyncio.create_task(manager.run())
    await stop.wait()
    manager.shutdown.set()
    await running
    await connection.close()


async def _run_procrastinate(conninfo: str, stop: asyncio.Event) -> None:
    app = procrastinate_app(conninfo)
    async with app.open_async():
        running = asyncio.create_task(app.run_worker_async(install_signal_handlers=False))
        await stop.wait()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def _main(system: str, conninfo: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = _run_pgqueuer if system == "pgqueuer" else _run_procrastinate
    await runner(conninfo, stop)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
