"""Whole passes on Postgres at 1, 8 and 64 in flight, against a raw floor of the same work.

Each point is ``processes x drivers`` (1x1, 2x4 and 2x32 by default): that many
driver processes, each with that many tasks in flight, on an engine whose pool is
sized to its tasks up to 8 (the server's connections are shared). The floor
takes a connection from its asyncpg pool per statement, which costs it CPU that
jobrun's store, keeping its connections, does not pay: with many steps per pass
the "floor" is then slower than jobrun (read those ratios as before/after
only). The runs never end (each
pass does ``--steps`` new trivial steps and commits the next cursor, so the run
is due again at once), four runs per task, so no driver waits for work. Two
variants per point, interleaved (one sample of each per round, the order
flipped every round), fresh runs before each:

* **floor**: raw asyncpg, three autocommit statements per pass on jobrun's own
  tables and indexes: claim one due run ``FOR UPDATE SKIP LOCKED`` setting its
  lease; upsert each step; commit the cursor and drop the ledger;
* **jobrun**: each task calls ``jobrun.run_due_jobs(store, registry, limit=1)``
  in a loop (what a worker's driver does), counting its claim statements at the
  store's executor (``statement_hook``; a counter, a few tenths of a µs each).

The driver processes are ``benchmarks/processes/passes_driver.py``.

Per sample: passes per second of wall time (all processes), the driver processes'
own CPU per pass (``time.process_time`` in each), claim statements per pass, the
load average. Reported: the median of the rounds with its spread, and the
floor/jobrun ratio as the median of per-round ratios. ``--pythonpath DIR`` runs
the jobrun variant on another checkout's code too (``JOBRUN_BENCH_CODE=DIR`` in its
drivers: a before/after in one run, the variants ``jobrun`` and ``jobrun@DIR``).
The database is a fresh one with a unique name, dropped at the end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Any

import asyncpg

import jobrun
from benchmarks import harness

MODULE_ID, JOB = "bench", "passes"
RUNS_PER_TASK = 4


async def sample(
    args: Any, url: str, variant: str, processes: int, tasks: int, steps: int
) -> dict[str, Any]:
    """One sample: ``processes`` children of ``variant`` for ``args.seconds``."""
    environment = harness.child_environment()
    name = "floor" if variant == "floor" else "jobrun"
    if variant != "floor" and variant != "jobrun":
        environment = harness.child_environment(JOBRUN_BENCH_CODE=args.pythonpath)
    command = [sys.executable, "-m", "benchmarks.processes.passes_driver", name, url]
    command += [str(tasks), str(steps), str(args.seconds)]
    children = [_spawn(command, environment) for _ in range(processes)]
    try:
        for process in children:
            assert process.stdout is not None
            line = await asyncio.to_thread(process.stdout.readline)
            assert line.strip() == "ready", line
        load_1min = harness.load()[0]
        for process in children:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        found = [json.loads(await asyncio.to_thread(_last_line, process)) for process in children]
    finally:
        for process in children:
            process.wait(timeout=120)
    passes = sum(one["passes"] for one in found)
    wall_s = max(one["wall_s"] for one in found)
    return {
        "passes_per_s": passes / wall_s,
        "cpu_us_per_pass": 1e6 * sum(one["cpu_s"] for one in found) / max(passes, 1),
        "claims_per_pass": sum(one["claims"] for one in found) / max(passes, 1),
        "found_nothing_due": sum(one["found nothing due"] for one in found),
        "load": load_1min,
    }


def _spawn(command: list[str], environment: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
    )


def _last_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline()


async def fresh_runs(admin: Any, store: jobrun.SqlJobRunStore, count: int) -> None:
    await admin.execute("DELETE FROM _substrat_job_steps")
    await admin.execute("DELETE FROM _substrat_job_runs")
    await admin.execute("VACUUM ANALYZE _substrat_job_runs, _substrat_job_steps")
    for _ in range(count):
        await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, instance=uuid.uuid4().hex)


def summary(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    return harness.spread([one[key] for one in samples])


async def measure_point(
    args: Any, url: str, admin: Any, store: Any, point: tuple[int, int], steps: int
) -> dict[str, Any]:
    processes, tasks = point
    variants = ["floor", "jobrun"] + ([f"jobrun@{args.pythonpath}"] if args.pythonpath else [])

    def one(variant: str) -> Any:
        async def fresh_sample() -> dict[str, Any]:
            await fresh_runs(admin, store, processes * tasks * RUNS_PER_TASK)
            return await sample(args, url, variant, processes, tasks, steps)

        return fresh_sample

    samples = await harness.interleave_samples(
        {variant: one(variant) for variant in variants}, args.rounds, warm_ups=0, collect=False
    )
    found: dict[str, Any] = {"samples": samples}
    for variant in variants:
        found[variant] = {
            key: summary(samples[variant], key)
            for key in ("passes_per_s", "cpu_us_per_pass", "claims_per_pass", "load")
        }
        if variant != "floor":
            ratios = [
                floor["passes_per_s"] / max(ours["passes_per_s"], 1e-9)
                for floor, ours in zip(samples["floor"], samples[variant], strict=True)
            ]
            found[variant]["floor_over_jobrun"] = harness.spread(ratios)
    return found


def rows_of(results: dict[str, Any], steps: int) -> list[list[Any]]:
    rows = []
    for label, found in results.items():
        for variant in [name for name in found if name != "samples" and name != "floor"]:
            ours, floor = found[variant], found["floor"]
            rows.append(
                [
                    label,
                    variant,
                    steps,
                    harness.shown(floor["passes_per_s"], 0),
                    harness.shown(ours["passes_per_s"], 0),
                    harness.shown(ours["floor_over_jobrun"], 2),
                    harness.shown(ours["claims_per_pass"], 2),
                    harness.shown(floor["cpu_us_per_pass"], 0),
                    harness.shown(ours["cpu_us_per_pass"], 0),
                    harness.shown(ours["load"], 1),
                ]
            )
    return rows


async def scenario(args: Any) -> None:
    if args.sqlite_only:
        raise SystemExit("the passes scenario measures Postgres only")
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.quick:
        args.seconds = 1.0
    url = await args.databases.postgres_url()
    engine = args.databases.engine_for(url, pool_size=2)
    await jobrun.upgrade(engine)
    store = jobrun.SqlJobRunStore(engine)
    admin = await asyncpg.connect(harness.driver_dsn(engine))
    try:
        await run_points(args, url, admin, store)
    finally:
        await admin.close()
        await engine.dispose()


async def run_points(args: Any, url: str, admin: Any, store: Any) -> None:
    points = [(1, 1), (1, 2)] if args.quick else [(1, 1), (2, 4), (2, 32)]
    step_counts = [int(count) for count in args.steps.split(",")]
    results: dict[str, Any] = {}
    for steps in step_counts:
        found = {
            f"{processes * tasks} ({processes}x{tasks})": await measure_point(
                args, url, admin, store, (processes, tasks), steps
            )
            for processes, tasks in points
        }
        results[f"{steps} steps"] = found
        harness.table(
            f"Whole passes of {steps} step(s), median [IQR] of {args.rounds} rounds",
            [
                "in flight",
                "variant",
                "steps",
                "floor passes/s",
                "jobrun passes/s",
                "floor/jobrun",
                "claim stmts/pass",
                "floor CPU µs/pass",
                "jobrun CPU µs/pass",
                "load",
            ],
            rows_of(found, steps),
        )
    harness.save(args, results)


if __name__ == "__main__":
    harness.run(scenario, seconds=3.0, steps="1", pythonpath="")
