"""DBOS Transact next to jobrun (child of ``bench_step.py --dbos``; needs the ``bench`` extra).

DBOS keeps one global instance per process bound to one system database, so
each dialect runs here in its own process: a DBOS workflow of N trivial async
``@DBOS.step`` calls and a jobrun pass of N trivial steps, interleaved, ms per
step. DBOS's SQLite system database gets jobrun's settings (WAL,
``synchronous=NORMAL``). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_step import step_runner
from harness import DEFAULT_POSTGRES, driver_dsn, fresh_engine

import jobrun


def system_url(backend: str, postgres_url: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{Path(tempfile.mkdtemp()) / 'dbos.sqlite'}"
    import psycopg
    from sqlalchemy import make_url

    admin = make_url(postgres_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute('DROP DATABASE IF EXISTS "dbos_bench_sys" WITH (FORCE)')
        conn.execute('CREATE DATABASE "dbos_bench_sys"')
    return admin.set(database="dbos_bench_sys").render_as_string(hide_password=False)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import sqlalchemy as sa
    from dbos import DBOS

    config: dict[str, Any] = {"name": "jobrun-bench", "log_level": "WARNING"}
    config["system_database_url"] = system_url(args.backend, args.postgres_url)
    if args.backend == "sqlite":
        wal = sa.create_engine(config["system_database_url"])

        @sa.event.listens_for(wal, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                dbapi_connection.execute(f"PRAGMA {pragma}")

        config["system_database_engine"] = wal
    DBOS(config=config)  # type: ignore[arg-type]

    @DBOS.step()
    async def trivial(i: int) -> int:
        return i

    @DBOS.workflow()
    async def loop(k: int) -> int:
        return sum([await trivial(i) for i in range(k)])

    DBOS.launch()
    engine = await fresh_engine(args.backend, argparse.Namespace(postgres_url=args.postgres_url))
    assert driver_dsn(engine)
    jobrun_step = step_runner(jobrun.SqlJobRunStore(engine), args.n)

    async def dbos_step() -> float:
        started = time.perf_counter()
        handle = await DBOS.start_workflow_async(loop, args.n)
        assert await handle.get_result() == args.n * (args.n - 1) // 2
        return (time.perf_counter() - started) * 1000 / args.n

    samples: dict[str, list[float]] = {"jobrun": [], "dbos": []}
    try:
        await jobrun_step(), await dbos_step()
        for round_number in range(args.rounds):
            pair = [("jobrun", jobrun_step), ("dbos", dbos_step)]
            for name, sample in pair if round_number % 2 else reversed(pair):
                samples[name].append(await sample())
    finally:
        DBOS.destroy()
        await engine.dispose()
    jr, db = (statistics.median(samples[name]) for name in ("jobrun", "dbos"))
    return {
        "jobrun_ms_per_step": round(jr, 4),
        "dbos_ms_per_step": round(db, 4),
        "dbos_over_jobrun": round(db / jr, 2),
        "run": uuid.uuid4().hex,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("backend", choices=["sqlite", "postgres"])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
    sys.stdout.flush()
