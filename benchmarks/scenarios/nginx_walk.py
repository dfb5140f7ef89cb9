"""The how-to's walk against a real rate limiter: nginx's ``limit_req`` (issue 33 item 4).

nginx (Debian's package, a child process on a free port) answers ``/objects/``
under ``limit_req`` at ``--rate`` a second, ``--burst``, ``nodelay``, status 429,
and sends no ``Retry-After``. ``--drivers`` processes of
``examples/walk_api_politely.py --drive`` declare the same rate and burst and walk
``--objects`` objects (a GET and a POST each, one token per request) in
``--drivers`` runs, sharing one database (``--backend``: a SQLite file, or a
throwaway Postgres database on the server of ``--postgres-url``). Measured from nginx's access log
(``$msec``): requests refused, and the rate served over the steady seconds (the
first and last second left out) as a share of ``--rate``. The goal: no refusal
and at least 97% of the rate on a quiet machine.

    .venv/bin/python -m benchmarks nginx_walk --drivers 4 --objects 3000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import harness
from tests.fake_api import in_a_process
from tests.nginx import limited_api

EXAMPLE = harness.REPO / "examples" / "walk_api_politely.py"


def walk(url: str, api: str, args: argparse.Namespace) -> float:
    """Start the runs, then ``--drivers`` driver processes until every run ended;
    the seconds the drivers took."""
    environment = harness.child_environment()
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


def measure(url: str, prefix: Path, args: Any) -> tuple[float, int, int, float]:
    """nginx (and the stand-in API behind it, with ``--latency-ms``), then the walk;
    the seconds it took, requests served and refused, the steady rate served."""
    with contextlib.ExitStack() as stack:
        upstream = None
        if args.latency_ms > 0:
            upstream = stack.enter_context(in_a_process(None, 1, args.latency_ms))
        nginx = stack.enter_context(limited_api(prefix, args.rate, args.burst, upstream))
        took_s = walk(url, nginx.url, args)
        served, refused, rate = served_rate(nginx.access_log())
        if os.environ.get("KEEP_LOG"):
            Path(os.environ["KEEP_LOG"]).write_text("\n".join(nginx.access_log()))
    return took_s, served, refused, rate


async def scenario(args: Any) -> None:
    if args.backend not in ("sqlite", "postgres"):
        raise SystemExit(f"--backend must be sqlite or postgres, got {args.backend!r}")
    if args.quick:
        args.drivers, args.objects = 2, 100
    url = await args.databases.url(args.backend)
    took_s, served, refused, rate = measure(url, args.databases.folder / "nginx", args)
    average = harness.load()
    print(
        f"{args.backend}: {args.drivers} drivers, {args.objects} objects, "
        f"nginx limit_req {args.rate:g}r/s "
        f"burst {args.burst} nodelay: served {served}, refused {refused}, "
        f"{rate:.1f}/s steady ({rate / args.rate:.1%} of the rate), {took_s:.1f} s; "
        f"load {average[0]:.2f} {average[1]:.2f}"
    )
    found = {"served": served, "refused": refused, "steady_per_s": round(rate, 2)}
    found |= {"share_of_rate": round(rate / args.rate, 4), "took_s": round(took_s, 2)}
    harness.save(
        args, {"backend": args.backend, "drivers": args.drivers, "objects": args.objects, **found}
    )


if __name__ == "__main__":
    # --latency-ms: behind nginx, the stand-in API (tests/fake_api.py, no limit of its
    # own) with this latency; 0: nginx answers itself.
    harness.run(
        scenario, drivers=4, objects=3000, rate=100.0, burst=5, backend="sqlite", latency_ms=0.0
    )
