"""A peer's worker for the drain scenario, as ``python -m benchmarks.processes.drain_peer
SYSTEM URL`` (``pgqueuer`` or ``procrastinate``; URL in libpq form), until SIGTERM.

Each runs its own worker loop with its defaults: PgQueuer's ``QueueManager.run``
on one asyncpg connection (entrypoint ``drain``), Procrastinate's
``run_worker_async`` (task ``bench.drain``). A module apart from the apps, so
neither is the ``__main__`` module that defines them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

from benchmarks.processes.drain_apps import PGQUEUER_ENTRYPOINT, procrastinate_app


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
