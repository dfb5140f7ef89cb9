"""The how-to's walk against a real rate limiter: nginx's ``limit_req`` (issue 33 item 4).

nginx (Debian's package, a child process on a free port) answers ``/objects/``
under ``limit_req`` at ``--rate`` a second, ``--burst``, ``nodelay``, status 429,
and sends no ``Retry-After``. ``--drivers`` processes of
``examples/walk_api_politely.py --drive`` declare the same rate and burst and walk
``--objects`` objects (a GET and a POST each, one token per request) in
``--drivers`` runs, sharing one SQLite database. Measured from nginx's access log
(``$msec``): requests refused, and the rate served over the steady seconds (the
first and last second left out) as a share of ``--rate``. The goal: no refusal
and at least 97% of the rate on a quiet machine.

    cd benchmarks && ../.venv/bin/python bench_nginx_walk.py --drivers 4 --objects 3000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.fake_api import in_a_process  # noqa: E402
from tests.nginx import limited_api  # noqa: E402

EXAMPLE = REPO / "examples" / "walk_api_politely.py"


@contextlib.contextmanager
def database(directory: Path, backend: str) -> Iterator[str]:
    """A database of its own for one walk: a SQLite file, or a Postgres database
    of a unique name, dropped after."""
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{directory / 'walk.db'}"
        return
    import asyncio

    import asyncpg

    name = f"bench_nginx_walk_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


def walk(url: str, api: str, args: argparse.Namespace) -> float:
    """Start the runs, then ``--drivers`` driver processes until every run ended;
    the seconds the drivers took."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    common = [sys.executable, str(EXAMPLE), "--url", url, "--api", api]
    starts = ["--objects", str(args.objects), "--runs", str(args.drivers), "--page", "100"]
    subprocess.run([*common, *starts], check=True, env=environment, stdout=subprocess.DEVNULL)
    limit = ["--per-second", f"{args.rate:g}", "--burst", str(args.burst), "--drive"]
    started = time.monotonic()
    drivers = [
        subprocess.Popen([*common, *limit], env=environment, stdout=subprocess.DEVNULL)
        for _ in range(args.drivers)
    ]
    for driver in drivers:
        driver.wait(timeout=3600)
    return time.monotonic() - started


def served_rate(lines: list[str]) -> tuple[int, int, float]:
    """(served, refused, served a second over the steady seconds) from ``$msec $status``."""
    seconds: Counter[int] = Counter()
    refused = 0
    for line in lines:
        at, status = line.split()[:2]
        if status == "429":
            refused += 1
        elif status == "200":
            seconds[int(float(at))] += 1
    steady = sorted(seconds)[1:-1]
    rate = sum(seconds[second] for second in steady) / max(1, len(steady))
    return sum(seconds.values()), refused, rate


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--drivers", type=int, default=4)
    parser.add_argument("--objects", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--burst", type=int, default=5)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--latency-ms", type=float, default=0.0,
        help="behind nginx, the stand-in API (tests/fake_api.py, no limit of its own) with "
        "this latency; 0: nginx answers itself",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a small walk (the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.drivers, args.objects = 2, 100
    with tempfile.TemporaryDirectory(prefix="bench_nginx_walk_") as temporary:
        directory = Path(temporary)
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(database(directory, args.backend))
            upstream = None
            if args.latency_ms > 0:
                upstream = stack.enter_context(in_a_process(None, 1, args.latency_ms))
            prefix = directory / "nginx"
            nginx = stack.enter_context(limited_api(prefix, args.rate, args.burst, upstream))
            took_s = walk(url, nginx.url, args)
            served, refused, rate = served_rate(nginx.access_log())
            if os.environ.get("KEEP_LOG"):
                Path(os.environ["KEEP_LOG"]).write_text("\n".join(nginx.access_log()))
    load = os.getloadavg()
    print(
        f"{args.backend}: {args.drivers} drivers, {args.objects} objects, "
        f"nginx limit_req {args.rate:g}r/s "
        f"burst {args.burst} nodelay: served {served}, refused {refused}, "
        f"{rate:.1f}/s steady ({rate / args.rate:.1%} of the rate), {took_s:.1f} s; "
        f"load {load[0]:.2f} {load[1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
