"""Drivers walking a real HTTP server that limits its callers (issue 23), per dialect.

The server is ``tests/fake_api.py`` in a process of its own: ``--latency-ms``
per request, a token bucket of ``--rate`` a second (depth ``burst + rate / 10``),
429 with ``Retry-After`` above it, ``Idempotency-Key`` honoured on writes. The
drivers are ``examples/walk_api_politely.py --drive``, one process each, sharing
one database and so one rate limit declared at the server's rate and burst.

* **polite**: ``--drivers`` processes walk ``--objects`` objects (a GET and a
  POST each, one token per request) in ``--drivers`` runs: the rate sustained
  (served per second over the steady seconds, the first and last active ones
  left out, as a share of ``--rate``), requests refused, objects fetched and
  written, and how many twice;
* **kill**: the same, with driver 0 killed (SIGKILL) once half the requests
  were served: objects fetched twice against what it could have had in flight
  (its ``--concurrency`` times the one run it drives at a time), written twice;
* **unlimited**: one run, one pass over ``--unlimited-objects`` objects of the
  server with no limit: ``p.map(concurrency=32)`` against one ``p.step`` at a
  time, interleaved, ms per object and the speed-up (issue 23 wants 20x).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

import jobrun
from benchmarks import harness
from tests.fake_api import LightClient, in_a_process, stats_of

EXAMPLE = harness.REPO / "examples" / "walk_api_politely.py"
LIGHT_DRIVER = "benchmarks.processes.walk_light_driver"
fake_api = in_a_process
stats = stats_of


def example(url: str, api: str, *arguments: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--url", url, "--api", api, *arguments]


def driver_command(client: str, url: str, api: str, *arguments: str) -> list[str]:
    """A driver: the example itself (httpx), or the same job on the light client."""
    if client == "httpx":
        return example(url, api, *arguments)
    if client != "light":
        raise SystemExit(f"--client must be httpx or light, got {client!r}")
    light = [sys.executable, "-m", LIGHT_DRIVER, "--url", url, "--api", api]
    return [*light, *arguments]


def steady_rate(per_second: list[int]) -> dict[str, float]:
    """Served per second over the active seconds less the first and last (partial) ones."""
    active = [index for index, served in enumerate(per_second) if served]
    steady = per_second[active[0] + 1 : active[-1]] if len(active) > 2 else per_second
    return {
        "steady_seconds": len(steady),
        "steady_mean_per_s": round(statistics.fmean(steady), 1),
        "steady_min_per_s": min(steady),
        "steady_max_per_s": max(steady),
    }


def drive_processes(
    url: str, args: Any, sizes: dict[str, int], kill: bool
) -> tuple[dict[str, Any], int | None, float]:
    """Start the runs, then the driver processes (driver 0 killed half-way if ``kill``);
    what the server saw once they are done, how much it had served at the kill, and
    the CPU seconds the drivers and the server used (the database's not included)."""
    cpu_before_s = harness.children_cpu_s()
    with fake_api(args.rate, args.burst, args.latency_ms) as api:
        shards = ["--objects", str(sizes["objects"]), "--runs", str(sizes["drivers"])]
        start = example(url, api, *shards, "--page", str(args.page))
        subprocess.run(
            start, check=True, env=harness.child_environment(), stdout=subprocess.DEVNULL
        )
        drive = ["--per-second", str(args.rate), "--burst", str(args.burst)]
        drive += ["--concurrency", str(args.concurrency), "--drive"]
        drivers = [
            subprocess.Popen(
                driver_command(args.client, url, api, *drive),
                env=harness.child_environment(),
                stdout=subprocess.DEVNULL,
            )
            for _ in range(sizes["drivers"])
        ]
        try:
            killed_at = None
            if kill:
                # Half the requests: two per object.
                while (served := stats(api)["served"]) < sizes["objects"]:
                    time.sleep(0.05)  # a poll interval
                drivers[0].send_signal(signal.SIGKILL)
                killed_at = served
            codes = [driver.wait(timeout=600) for driver in drivers]
        finally:
            for driver in drivers:
                driver.kill()
                driver.wait()
        assert codes[1:] == [0] * (len(codes) - 1), codes
        seen = stats(api)
    return seen, killed_at, harness.children_cpu_s() - cpu_before_s


async def walk(backend: str, args: Any, sizes: dict[str, int], kill: bool) -> dict[str, Any]:
    engine = await args.databases.engine(backend)
    url = engine.url.render_as_string(hide_password=False)
    seen, killed_at, cpu_s = await asyncio.to_thread(drive_processes, url, args, sizes, kill)
    runs = await jobrun.job_runs(jobrun.SqlJobRunStore(engine), module_id="objects", job="walk")
    await engine.dispose()
    assert all(run.status == "done" for run in runs), [run.last_error for run in runs]
    found = {
        "served": seen["served"],
        "refused": seen["refused"],
        "objects_fetched": len(seen["fetches"]),
        "objects_written": len(seen["writes"]),
        "fetched_twice": sum(1 for count in seen["fetches"].values() if count > 1),
        "written_twice": sum(1 for count in seen["writes"].values() if count > 1),
        "objects_counted": sum(run.counters["objects"] for run in runs),
        "served_per_second": seen["served_per_second"],
        "cpu_ms_per_request": round(cpu_s * 1000 / seen["served"], 3),
        **steady_rate(seen["served_per_second"]),
    }
    found["steady_share_of_rate"] = round(found["steady_mean_per_s"] / args.rate, 4)
    if kill:
        found["killed_at_served"] = killed_at
        found["killed_in_flight_at_most"] = args.concurrency
    return found


def unlimited_runner(
    store: jobrun.SqlJobRunStore, client: Any, n: int, concurrency: int | None
) -> harness.Sample:
    """One pass fetching ``n`` objects (``concurrency`` None: one step at a time); ms/object."""

    async def fetch(number: int) -> Any:
        answer = await client.request("GET", f"/objects/{number}")
        answer.raise_for_status()
        return answer.json()

    async def steps(p: jobrun.JobPass) -> None:
        if concurrency is None:
            for number in range(n):
                await p.step(f"get-{number}", lambda number=number: fetch(number))
        else:
            await p.map(
                fetch, range(n), name=lambda number: f"get-{number}", concurrency=concurrency
            )

    job = "sequential" if concurrency is None else f"map-{concurrency}"
    return harness.timed_pass(store, job, steps, n)


def httpx_floor(client: httpx.AsyncClient, n: int, concurrency: int) -> Any:
    """The same ``n`` requests, ``concurrency`` at once, with no jobrun at all; ms/object."""

    async def sample() -> float:
        started = time.perf_counter()
        gate = asyncio.Semaphore(concurrency)

        async def fetch(number: int) -> None:
            async with gate:
                (await client.request("GET", f"/objects/{number}")).raise_for_status()

        await asyncio.gather(*(fetch(number) for number in range(n)))
        return harness.timed_ms(started, n)

    return sample


async def unlimited(backend: str, args: Any, n: int) -> dict[str, float]:
    engine = await args.databases.engine(backend)
    store = jobrun.SqlJobRunStore(engine)
    with fake_api(None, 1, args.latency_ms) as api:
        client: Any
        async with contextlib.AsyncExitStack() as stack:
            if args.client == "light":
                client = LightClient(api, 64)
                stack.push_async_callback(client.aclose)
            else:
                client = await stack.enter_async_context(
                    httpx.AsyncClient(base_url=api, limits=httpx.Limits(max_connections=64))
                )
            variants = {
                "one at a time": unlimited_runner(store, client, n, None),
                "p.map, concurrency=32": unlimited_runner(store, client, n, 32),
                "requests alone, 32 at once": httpx_floor(client, n, 32),
            }
            found = await harness.interleave(variants, args.rounds or (1 if args.quick else 3))
    await engine.dispose()
    # (The floor is the requests with no steps: what p.map could at best come to.)
    found["speed-up"] = round(found["one at a time"] / found["p.map, concurrency=32"], 2)
    return found


def token_runner(store: jobrun.SqlJobRunStore, n: int, limited: bool) -> harness.Sample:
    """One pass of ``n`` new trivial steps, each taking a token (a bucket that never
    runs dry) or not; ms per step."""
    registry = jobrun.JobRegistry()
    registry.rate_limit("bench-tokens", per_second=1e9, burst=1_000_000)
    limit = "bench-tokens" if limited else None

    async def steps(p: jobrun.JobPass) -> None:
        for number in range(n):
            await p.step(f"s{number}", lambda number=number: number, rate_limit=limit)

    job = "with-token" if limited else "without"
    return harness.timed_pass(store, job, steps, n, registry)


async def token_cost(backend: str, args: Any, n: int) -> dict[str, float]:
    """What a token adds to a step: the same steps with and without ``rate_limit=``."""
    engine = await args.databases.engine(backend)
    store = jobrun.SqlJobRunStore(engine)
    variants = {
        "step": token_runner(store, n, limited=False),
        "step + token": token_runner(store, n, limited=True),
    }
    found = await harness.interleave(variants, args.rounds or (1 if args.quick else 7))
    await engine.dispose()
    found["token"] = round(found["step + token"] - found["step"], 4)
    return found


async def scenario(args: Any) -> None:
    if args.quick:
        args.rate = min(args.rate, 100.0)
    sizes = (
        {"objects": 150, "drivers": 2}
        if args.quick
        else {"objects": args.objects, "drivers": args.drivers}
    )
    unlimited_n = 40 if args.quick else args.unlimited_objects
    results: dict[str, Any] = {"sizes": sizes, "rate": args.rate, "burst": args.burst}
    for backend in harness.backends(args):
        polite = await walk(backend, args, sizes, kill=False)
        print(f"{backend} polite: {polite}", flush=True)
        killed = await walk(backend, args, sizes, kill=True)
        print(f"{backend} kill: {killed}", flush=True)
        speed = await unlimited(backend, args, unlimited_n)
        print(f"{backend} unlimited: {speed}", flush=True)
        token = await token_cost(backend, args, 50 if args.quick else args.token_steps)
        print(f"{backend} token: {token}", flush=True)
        results[backend] = {"polite": polite, "kill": killed, "unlimited": speed, "token": token}
    report(args, results, unlimited_n)
    harness.save(args, results)


def walk_cells(polite: dict[str, Any], killed: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """One backend's cells of the polite table and of the kill -9 table."""
    polite_cells = [
        f"{polite['steady_mean_per_s']} ({polite['steady_share_of_rate']:.1%})",
        f"{polite['steady_min_per_s']}-{polite['steady_max_per_s']}",
        polite["refused"],
        f"{polite['objects_fetched']}/{polite['objects_written']}",
        f"{polite['fetched_twice']}/{polite['written_twice']}",
        polite["cpu_ms_per_request"],
    ]
    kill_cells = [
        killed["killed_at_served"],
        f"{killed['fetched_twice']} (at most {killed['killed_in_flight_at_most']})",
        killed["written_twice"],
        killed["refused"],
        f"{killed['steady_mean_per_s']} ({killed['steady_share_of_rate']:.1%})",
    ]
    return polite_cells, kill_cells


def report(args: Any, results: dict[str, Any], unlimited_n: int) -> None:
    """The four tables: polite, kill -9, unlimited, a token's cost."""
    sizes = results["sizes"]
    rows: list[list[list[Any]]] = [[], [], [], []]
    for backend in harness.backends(args):
        found = results[backend]
        polite_cells, kill_cells = walk_cells(found["polite"], found["kill"])
        speed, token = found["unlimited"], found["token"]
        rows[0].append([backend, *polite_cells])
        rows[1].append([backend, *kill_cells])
        speeds = [speed[name] for name in ("one at a time", "p.map, concurrency=32")]
        alone = speed["requests alone, 32 at once"]
        speed_up = f"{speed['speed-up']:.1f}x"
        rows[2].append([backend, *(f"{value:.2f}" for value in speeds), speed_up, f"{alone:.2f}"])
        rows[3].append(
            [backend, *(f"{token[name]:.3f}" for name in ("step", "step + token", "token"))]
        )
    walked = f"{sizes['drivers']} drivers, {sizes['objects']} objects (2 requests each)"
    polite_header = ["steady req/s (of rate)", "steady range", "refused", "fetched/written"]
    harness.table(
        f"polite: {walked}, {args.rate:g}/s burst {args.burst}, concurrency {args.concurrency}, "
        f"client {args.client}",
        ["", *polite_header, "twice f/w", "CPU ms/request"],
        rows[0],
    )
    harness.table(
        "kill -9 of driver 0 half-way",
        ["", "killed at served", "fetched twice", "written twice", "refused", "steady req/s"],
        rows[1],
    )
    speed_header = ["one step at a time", "p.map, concurrency=32", "speed-up"]
    harness.table(
        f"unlimited: one pass of {unlimited_n} objects, {args.latency_ms:g} ms API, ms/object",
        ["", *speed_header, "requests alone, 32 at once"],
        rows[2],
    )
    harness.table(
        "what a token costs a step (one pass of new trivial steps, ms per step, medians)",
        ["", "step", "step + token", "token"],
        rows[3],
    )


if __name__ == "__main__":
    defaults = {
        "objects": 3000,
        "drivers": 4,
        "rate": 300.0,
        "burst": 5,
        "concurrency": 32,
        "page": 100,
        "latency_ms": 20.0,
        "unlimited_objects": 500,
        "token_steps": 500,
        # httpx (the example as users run it) or light (tests.fake_api.LightClient):
        # httpx's CPU per request, not jobrun, caps the rate on a small machine.
        "client": "httpx",
    }
    harness.run(scenario, **defaults)
