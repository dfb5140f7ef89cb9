"""DBOS Transact next to jobrun: the child of ``python -m benchmarks step --dbos`` (needs
the ``bench`` extra).

DBOS keeps one global instance per process bound to one system database, so
each dialect runs here in its own process: a DBOS workflow of N trivial async
``@DBOS.step`` calls and a jobrun pass of N trivial steps, interleaved, ms per
step. DBOS's SQLite system database gets jobrun's settings (WAL,
``synchronous=NORMAL``). Both databases are throwaways of this process (unique
names on the server of ``--postgres-url``, dropped at the end). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
from typing import Any

import jobrun
from benchmarks.harness import DEFAULT_POSTGRES, Databases, interleave_samples, step_runner
from benchmarks.processes.dbos_app import dbos_runner


async def measure(args: argparse.Namespace, databases: Databases) -> dict[str, Any]:
    dbos_step, close = await dbos_runner(databases, args.backend, "jobrun-bench", args.n)
    engine = await databases.engine(args.backend)
    jobrun_step = step_runner(jobrun.SqlJobRunStore(engine), args.n)
    try:
        # DBOS first in even rounds, jobrun first in odd ones.
        variants = {"dbos": dbos_step, "jobrun": jobrun_step}
        samples = await interleave_samples(variants, args.rounds, collect=False)
    finally:
        close()
        await engine.dispose()
    jr, db = (statistics.median(samples[name]) for name in ("jobrun", "dbos"))
    return {
        "jobrun_ms_per_step": round(jr, 4),
        "dbos_ms_per_step": round(db, 4),
        "dbos_over_jobrun": round(db / jr, 2),
        "run": uuid.uuid4().hex,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with Databases(args.postgres_url, "dbos_steps") as databases:
        return await measure(args, databases)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("backend", choices=["sqlite", "postgres"])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
    sys.stdout.flush()
