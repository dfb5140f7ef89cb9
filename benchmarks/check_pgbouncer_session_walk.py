"""The walk example behind PgBouncer in session mode: connections per driver process.

An on-demand check (issue 33 item 3), not a speed benchmark. A PgBouncer of its own
(``pgbouncer_process.py``, ``pool_mode = session``, ``--pool-size`` server
connections, 12 by default), the stand-in API (``tests/fake_api.py``, 300
requests/s), runs started once with ``examples/walk_api_politely.py``, then
``--drivers`` processes of that example (``--drive --loops 2``: ``run_worker`` on
the store it made from its own engine) through PgBouncer. It prints how long the
walk took, each driver's exit status and last error line, the most server
connections seen on the database, and in how many of the half-second samples
PgBouncer had clients waiting (``SHOW POOLS``, ``cl_waiting``).

    ../.venv/bin/python check_pgbouncer_session_walk.py --objects 1500

Run from an older checkout's ``benchmarks/`` for the figure before a change.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pgbouncer_process import PgBouncer

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WALK = REPO / "examples" / "walk_api_politely.py"
SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
SAMPLE_S = 0.5


def psql(port: int, database: str, statement: str) -> str:
    """One statement with psql (PgBouncer's console speaks the simple protocol only)."""
    command = ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-At"]
    found = subprocess.run(
        [*command, "-c", statement, database], capture_output=True, text=True, check=False
    )
    return found.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def walk(*args: str) -> list[str]:
    return [sys.executable, str(WALK), "--per-second", "280", *args]


def clients_waiting(port: int, database: str) -> bool:
    return any(
        line.split("|")[0] == database and int(line.split("|")[3]) > 0
        for line in psql(port, "pgbouncer", "SHOW POOLS").splitlines()
    )


def drive_through(args: argparse.Namespace, bouncer: PgBouncer, name: str, api: str) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{bouncer.port}/{name}"
    began = time.monotonic()
    drivers = [
        subprocess.Popen(
            walk("--url", url, "--api", api, "--drive", "--loops", "2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(args.drivers)
    ]
    most, waited, samples = 0, 0, 0
    while any(driver.poll() is None for driver in drivers):
        if time.monotonic() - began > args.limit_s:
            break
        counted = psql(
            5432, "postgres", f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}'"
        )
        most = max(most, int(counted or 0))
        samples += 1
        waited += clients_waiting(bouncer.port, name)
        time.sleep(SAMPLE_S)  # the sampling period
    took_s = time.monotonic() - began
    for number, driver in enumerate(drivers):
        if driver.poll() is None:
            driver.kill()
        _, errors = driver.communicate()
        last = [line for line in errors.splitlines() if "Error" in line][-1:]
        print(f"driver {number}: exit {driver.returncode} {last[0].strip()[:160] if last else ''}")
    print(
        f"{args.objects} objects, {args.drivers} drivers, pool {args.pool_size}: "
        f"{took_s:.1f} s (limit {args.limit_s:.0f} s), at most {most} server connections, "
        f"clients waiting in {waited} of {samples} samples"
    )


def main(args: argparse.Namespace) -> None:
    name = f"jobrun_bouncer_walk_{uuid.uuid4().hex[:10]}"
    psql(5432, "postgres", f'CREATE DATABASE "{name}"')
    api = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_api", "--per-second", "300", "--burst", "5"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert api.stdout is not None
        api_url = api.stdout.readline().strip()
        direct = f"postgresql+asyncpg://postgres@127.0.0.1/{name}"
        started = walk("--url", direct, "--api", api_url, "--objects", str(args.objects))
        subprocess.run([*started, "--runs", "4"], check=True, capture_output=True)
        with PgBouncer(SERVER, free_port(), args.pool_size, mode="session") as bouncer:
            drive_through(args, bouncer, name, api_url)
    finally:
        api.kill()
        psql(5432, "postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--objects", type=int, default=1500)
    parser.add_argument("--drivers", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=12)
    parser.add_argument("--limit-s", type=float, default=300.0, help="give up after this long")
    os.environ.setdefault("PYTHONPATH", str(REPO))
    main(parser.parse_args())
