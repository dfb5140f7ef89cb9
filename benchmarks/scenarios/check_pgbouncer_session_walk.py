"""The walk example behind PgBouncer in session mode: connections per driver process.

An on-demand check (issue 33 item 3), not a speed benchmark. A PgBouncer of its own
(``benchmarks/processes/pgbouncer.py``, ``pool_mode = session``, ``--pool-size`` server
connections, 12 by default), the stand-in API (``tests/fake_api.py``, 300
requests/s), runs started once with ``examples/walk_api_politely.py``, then
``--drivers`` processes of that example (``--drive --loops 2``: ``run_worker`` on
the store it made from its own engine) through PgBouncer. It prints how long the
walk took, each driver's exit status and last error line, the most server
connections seen on the database, and in how many of the half-second samples
PgBouncer had clients waiting (``SHOW POOLS``, ``cl_waiting``).

    .venv/bin/python -m benchmarks check_pgbouncer_session_walk --objects 1500

For the figure before a change, ``JOBRUN_BENCH_CODE=DIR`` runs the drivers on another
checkout's jobrun.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from sqlalchemy import make_url

from benchmarks import harness
from benchmarks.processes.pgbouncer import PgBouncer, free_port, psql
from tests.fake_api import in_a_process

WALK = harness.REPO / "examples" / "walk_api_politely.py"
SAMPLE_S = 0.5


def walk(*args: str) -> list[str]:
    return [sys.executable, str(WALK), "--per-second", "280", *args]


def clients_waiting(bouncer: PgBouncer, database: str) -> bool:
    return any(
        line.split("|")[0] == database and int(line.split("|")[3]) > 0
        for line in bouncer.admin("SHOW POOLS").splitlines()
    )


def drive_through(args: Any, bouncer: PgBouncer, name: str, api: str) -> dict[str, Any]:
    began = time.monotonic()
    drivers = [
        subprocess.Popen(
            walk("--url", bouncer.url(name), "--api", api, "--drive", "--loops", "2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=harness.child_environment(),
        )
        for _ in range(args.drivers)
    ]
    most, waited, samples = 0, 0, 0
    count = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}'"
    while any(driver.poll() is None for driver in drivers):
        if time.monotonic() - began > args.limit_s:
            break
        most = max(most, int(psql(args.postgres_url, count) or 0))
        samples += 1
        waited += clients_waiting(bouncer, name)
        time.sleep(SAMPLE_S)  # the sampling period
    took_s = time.monotonic() - began
    exits = []
    for number, driver in enumerate(drivers):
        if driver.poll() is None:
            driver.kill()
        _, errors = driver.communicate()
        last = [line for line in errors.splitlines() if "Error" in line][-1:]
        exits.append([driver.returncode, last[0].strip()[:160] if last else ""])
        print(f"driver {number}: exit {exits[-1][0]} {exits[-1][1]}")
    print(
        f"{args.objects} objects, {args.drivers} drivers, pool {args.pool_size}: "
        f"{took_s:.1f} s (limit {args.limit_s:.0f} s), at most {most} server connections, "
        f"clients waiting in {waited} of {samples} samples"
    )
    found = {"took_s": round(took_s, 2), "most_server_connections": most}
    return {**found, "samples_waiting": waited, "samples": samples, "drivers_exits": exits}


def walk_through(args: Any, direct: str) -> dict[str, Any]:
    """The stand-in API, the runs started directly, then the drivers through PgBouncer."""
    name = str(make_url(direct).database)
    with in_a_process(300, 5) as api:
        started = walk("--url", direct, "--api", api, "--objects", str(args.objects))
        subprocess.run(
            [*started, "--runs", "4"],
            check=True,
            capture_output=True,
            env=harness.child_environment(),
        )
        with PgBouncer(args.postgres_url, free_port(), args.pool_size, mode="session") as bouncer:
            return drive_through(args, bouncer, name, api)


async def scenario(args: Any) -> None:
    direct = await args.databases.postgres_url()
    found = walk_through(args, direct)
    harness.save(args, {"objects": args.objects, "drivers": args.drivers, **found})


if __name__ == "__main__":
    # --limit-s: give up on the walk after this long.
    harness.run(scenario, objects=1500, drivers=3, pool_size=12, limit_s=300.0)
