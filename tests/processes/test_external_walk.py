"""Driver processes walk a real HTTP server that limits its callers (issue 23, CI size).

The server is ``tests/fake_api.py`` in a process of its own (a token bucket of
``API_RATE`` a second, 429 with ``Retry-After`` above it, ``Idempotency-Key``
honoured on writes). The drivers are ``examples/walk_api_politely.py --drive``,
each a process of its own with its own engine, sharing one database (a SQLite
file, or Postgres) and so one rate-limit bucket declared at the API's rate:

* two drivers walk every object: the server refused nothing, served no second
  above its bucket's allowance, and saw each object fetched once and written once;
* one of them is killed (SIGKILL) half-way: the other takes its run over and
  finishes; an object fetched twice is one whose fetch was in flight at the kill
  (at most the killed driver's concurrency), and none was written twice, since a
  replayed mark carries the same idempotency key.

Speed is not asserted here (machines are noisy): ``benchmarks/scenarios/external_walk.py``
measures the sustained rate and the speed-up of ``p.map`` at full size.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

import jobrun
from tests.fake_api import in_a_process, stats_of
from tests.support import REPO, SQL_BACKENDS, run_in_thread

EXAMPLE = REPO / "examples" / "walk_api_politely.py"
API_RATE, BURST = 100, 5
# The server's bucket holds burst + a tenth of a second's rate (tests/fake_api.py).
ALLOWANCE = API_RATE + BURST + API_RATE // 10
# Two drivers with 6 requests each in flight can never send more than 12 at once,
# below the API's slack, even when the machine stalls them both: a loaded CI host
# then cannot make the API refuse (the benchmark shows what stalls do at 32).
OBJECTS, RUNS, PAGE, CONCURRENCY = 300, 2, 50, 6


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def fake_api(per_second: float, burst: int) -> Any:
    """The stand-in API in a process of its own; its base URL."""
    return in_a_process(per_second, burst)


stats = stats_of


def example(url: str, api: str, *options: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--url", url, "--api", api, *options]


def start_runs(url: str, api: str) -> None:
    options = ["--objects", str(OBJECTS), "--runs", str(RUNS), "--page", str(PAGE)]
    started = subprocess.run(
        example(url, api, *options),
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(),
        check=False,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.count(": running {}") == RUNS, started.stdout


class Drivers:
    """Driver processes (the example with ``--drive``), their output in files."""

    def __init__(self, url: str, api: str, logs: Path) -> None:
        self.url, self.api, self.logs = url, api, logs
        self.processes: list[subprocess.Popen[str]] = []
        self.files: list[IO[str]] = []

    def start(self, count: int) -> None:
        options = ["--per-second", str(API_RATE), "--burst", str(BURST)]
        options += ["--concurrency", str(CONCURRENCY), "--drive"]
        for number in range(count):
            log = (self.logs / f"driver-{number}.log").open("w")
            self.files.append(log)
            self.processes.append(
                subprocess.Popen(
                    example(self.url, self.api, *options),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=environment(),
                    text=True,
                )
            )

    def output(self, number: int) -> str:
        return (self.logs / f"driver-{number}.log").read_text()[-3000:]

    def finish(self, number: int, timeout_s: float = 60) -> None:
        code = self.processes[number].wait(timeout=timeout_s)
        assert code == 0, self.output(number)

    def stop_all(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        for log in self.files:
            log.close()


@pytest.fixture
def walk(database_url: str, tmp_path: Path) -> Iterator[Drivers]:
    with fake_api(API_RATE, BURST) as api:
        start_runs(database_url, api)
        drivers = Drivers(database_url, api, tmp_path)
        try:
            yield drivers
        finally:
            drivers.stop_all()


def walked_runs(url: str) -> list[jobrun.JobRun]:
    async def read() -> list[jobrun.JobRun]:
        engine = create_async_engine(url)
        try:
            return await jobrun.job_runs(
                jobrun.SqlJobRunStore(engine), module_id="objects", job="walk"
            )
        finally:
            await engine.dispose()

    return run_in_thread(read)


def assert_walked(url: str, seen: dict[str, Any]) -> None:
    runs = walked_runs(url)
    assert len(runs) == RUNS
    assert all(run.status == "done" for run in runs), [run.last_error for run in runs]
    # Counters commit with their pass: exact, whatever was replayed.
    assert sum(run.counters["objects"] for run in runs) == OBJECTS
    assert seen["refused"] == 0, "the drivers kept to the API's rate: nothing was refused"
    assert sorted(map(int, seen["fetches"])) == list(range(OBJECTS)), "every object fetched"
    assert sorted(map(int, seen["writes"])) == list(range(OBJECTS)), "every object written"
    assert max(seen["served_per_second"]) <= ALLOWANCE, seen["served_per_second"]


def twice(counts: dict[str, int]) -> int:
    return sum(1 for count in counts.values() if count > 1)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_two_drivers_walk_every_object_once_within_the_rate(backend: str, walk: Drivers) -> None:
    began = time.monotonic()
    walk.start(2)
    for number in range(2):
        walk.finish(number)
    seen = stats(walk.api)
    print(
        f"\n{backend}: {OBJECTS} objects, {seen['served']} requests in "
        f"{time.monotonic() - began:.1f} s at {API_RATE}/s; served per second "
        f"{seen['served_per_second']}"
    )
    assert_walked(walk.url, seen)
    assert (twice(seen["fetches"]), twice(seen["writes"])) == (0, 0)


@pytest.mark.parametrize("backend", SQL_BACKENDS)
def test_a_driver_killed_half_way_costs_only_its_fetches_in_flight(
    backend: str, walk: Drivers
) -> None:
    walk.start(2)
    half = OBJECTS  # two requests per object
    deadline = time.monotonic() + 60
    while stats(walk.api)["served"] < half:
        assert all(p.poll() is None for p in walk.processes), "a driver ended before the kill"
        assert time.monotonic() < deadline, "half the requests were not served within 60 s"
        # sleep: a poll interval; the deadline only bounds a hang
        time.sleep(0.05)
    victim = walk.processes[0]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    walk.finish(1)
    seen = stats(walk.api)
    fetched_twice, written_twice = twice(seen["fetches"]), twice(seen["writes"])
    print(
        f"\n{backend}: killed at {half} requests served; fetched twice {fetched_twice} "
        f"(in flight at most {CONCURRENCY}), written twice {written_twice}"
    )
    assert_walked(walk.url, seen)
    # The killed driver drives one run at a time, at most CONCURRENCY requests at once:
    # only those can have been answered and not yet stored.
    assert fetched_twice <= CONCURRENCY
    assert max(seen["fetches"].values()) <= 2
    assert written_twice == 0, "a replayed mark carries the same Idempotency-Key"
