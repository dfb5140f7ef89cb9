"""The how-to's walk against a real rate limiter: nginx's ``limit_req`` (Debian's package).

``docs/how-to/walk-an-api-politely.md``'s example, as its reader runs it: runs
started once, then driver processes (``--drive``) that declare the API's own rate
and burst, against nginx answering ``/objects/`` under ``limit_req`` (``burst``,
``nodelay``, status 429, no ``Retry-After``). Nothing may be refused, even when
one driver stalls for two seconds (``SIGSTOP``: a loaded host, a long garbage
collection) with tokens granted to it, and then wakes with all of them due.

The rate here is low (20 a second: a token every 50 ms), so that a loaded test
machine's stalls stay within what jobrun keeps back of the burst; how close to
the rate the walk comes is a benchmark's business (``benchmarks/scenarios/nginx_walk.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.nginx import Nginx, limited_api
from tests.support import REPO, SQL_BACKENDS

EXAMPLE = REPO / "examples" / "walk_api_politely.py"
RATE, BURST = 20, 5


def _stall_once_walking(nginx: Nginx, driver: subprocess.Popen[str]) -> None:
    """Stop ``driver`` for 2 s once the walk is well under way (40 requests seen)."""
    deadline = time.monotonic() + 120  # bounds a hang only
    while len(nginx.access_log()) < 40:
        assert time.monotonic() < deadline, "the walk did not start"
        assert driver.poll() is None, "the driver ended before the stall"
        time.sleep(0.05)
    driver.send_signal(signal.SIGSTOP)
    time.sleep(2.0)  # the stall itself (the fault injected), not a wait for an event


def _example(url: str, api: str, *options: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--url", url, "--api", api, *options]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_drivers_declared_at_nginx_s_rate_and_burst_are_never_refused(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    objects, drivers = 120, 2
    with limited_api(tmp_path / "nginx", RATE, BURST) as nginx:
        starts = ["--objects", str(objects), "--runs", str(drivers), "--page", "25"]
        subprocess.run(
            _example(database_url, nginx.url, *starts), env=environment, check=True, timeout=120
        )
        limit = ["--per-second", str(RATE), "--burst", str(BURST), "--drive"]
        children = [
            subprocess.Popen(
                _example(database_url, nginx.url, *limit),
                env=environment,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(drivers)
        ]
        try:
            _stall_once_walking(nginx, children[0])
        finally:
            children[0].send_signal(signal.SIGCONT)
        outputs = [child.communicate(timeout=300)[0] for child in children]
        statuses = [line.split()[1] for line in nginx.access_log()]
    assert all(child.returncode == 0 for child in children), outputs
    # Every run walked its shard: a GET and a POST per object, each answered.
    assert all(output.count(": done ") == drivers for output in outputs), outputs
    assert statuses.count("200") == 2 * objects
    assert statuses.count("429") == 0


COOL_S = 8.0


def _arrivals(nginx: Nginx) -> list[tuple[float, str, str]]:
    """(arrival instant, status, object id) of each request nginx logged."""
    found = []
    for line in nginx.access_log():
        logged, status, took, _, uri = line.split()
        found.append((float(logged) - float(took), status, uri.split("/")[2]))
    return sorted(found)


def _wait_for(nginx: Nginx, what: Callable[[list[tuple[float, str, str]]], bool]) -> None:
    deadline = time.monotonic() + 45  # bounds a hang only
    while not what(_arrivals(nginx)):
        assert time.monotonic() < deadline, f"not seen in nginx's log: {_arrivals(nginx)}"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_a_429_holds_the_limit_for_every_run_and_driver_until_it_ends(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    # nginx lets a few requests through, then one a minute: the walk is soon
    # refused. jobrun is told 50/s, far more than nginx allows.
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with limited_api(tmp_path / "nginx", "1r/m", 1) as nginx:
        first = ["--objects", "20", "--runs", "1", "--page", "2"]
        subprocess.run(
            _example(database_url, nginx.url, *first), env=environment, check=True, timeout=120
        )
        drive = ["--per-second", "50", "--burst", "5", "--concurrency", "1"]
        drive += ["--no-header-s", str(COOL_S), "--drive"]
        drivers = [
            subprocess.Popen(
                _example(database_url, nginx.url, *drive),
                env=environment,
                stdout=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        try:
            _wait_for(nginx, lambda seen: any(status == "429" for _, status, _ in seen))
            # A run started after the 429 (objects 20 to 39), for whichever driver is free.
            more = ["--objects", "40", "--runs", "2", "--page", "2"]
            subprocess.run(
                _example(database_url, nginx.url, *more), env=environment, check=True, timeout=120
            )
            _wait_for(nginx, lambda seen: any(int(number) >= 20 for _, _, number in seen))
        finally:
            for driver in drivers:
                driver.kill()
                driver.wait(timeout=30)
        seen = _arrivals(nginx)
    refused_at = min(at for at, status, _ in seen if status == "429")
    after = [(at - refused_at, number) for at, _, number in seen if at > refused_at]
    # Nothing reached nginx while the limit cooled down: not the refused run's
    # other steps, not the run started meanwhile, from either driver (the 10 ms
    # allow for the database's clock being read in whole milliseconds).
    assert after, "no request after the cooling down"
    assert min(delay for delay, _ in after) >= COOL_S - 0.01, after
