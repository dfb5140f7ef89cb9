"""The ceiling of one Postgres for jobrun: steps/s and passes/s as driver processes are added.

For each count of driver processes (``--processes``, 1, 2, 4, 8 by default), each
process runs ``--in-flight`` tasks, each calling ``jobrun.run_due_jobs(store,
registry, limit=1)`` in a loop, on an engine whose pool is sized ``--in-flight``.
The runs never end: every pass does its new trivial steps
(``await p.step(name, lambda: i)``) and commits the next cursor, so the run is due
again at once and any driver may claim it next. There are four runs per task in
flight, so no driver waits for work. Two workloads:

* **steps**: passes of ``--steps`` new steps: what one Postgres gives per step;
* **passes**: passes of one step: what a pass (claim, step, commit) costs.

Each point is measured over ``--seconds`` after a warm-up (pools full, presences
held), between two snapshots taken while every driver's connections are open:

* steps and passes committed (counted by the drivers), per second of wall time;
* the server's CPU: ``utime + stime`` from ``/proc/<pid>/stat`` of the client
  backends serving the benchmark (``pg_stat_activity`` rows named
  ``jobrun-ceiling``, and the drivers' jobrun presence sessions), per step or pass;
  the server's own processes (WAL writer, checkpointer, autovacuum) apart, as they
  also serve anything else on the server;
* the drivers' CPU, from their own ``/proc/<pid>/stat``, per step or pass;
* WAL bytes: ``pg_current_wal_lsn()`` before and after (``pg_wal_lsn_diff``), per
  step or pass; on a shared server that counts every database's writes, so where
  ``pg_waldump`` can read the server's ``pg_wal`` the bytes of this database's
  records alone are given too (see ``benchmarks/harness/server_usage.py``);
* the machine: busy share of all CPUs, and the share of 0.25 s intervals with
  no idle CPU left (saturated).

On a small machine the drivers share the CPUs with the server: the figures say
how the CPU time was split, so the ceiling is read as "this much server CPU per
step", not as a rate another machine would see. Rounds alternate the order of
the points; medians over rounds are reported. ``--count-statements`` also counts
the statements each pass sent, by store operation (through ``statement_hook``,
which costs the drivers a little CPU: keep it out of the CPU figures). ``--quick``
runs 1 and 2 processes for a second each. Postgres only (``--sqlite-only`` is
refused).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg
from sqlalchemy import make_url

import jobrun
from benchmarks import harness
from benchmarks.harness.server_usage import (
    MachineCpu,
    WalReader,
    backend_pids,
    background_pids,
    other_commits,
    processes_cpu_s,
    spent_between,
    wal_bytes,
    wal_lsn,
)
from benchmarks.processes.ceiling_driver import APPLICATION, JOB, MODULE_ID, driver_process

RUNS_PER_TASK = 4
SAMPLE_EVERY_S = 0.25


async def snapshot(admin: Any, database: str, drivers: list[int]) -> dict[str, Any]:
    backends = await backend_pids(admin, APPLICATION, database)
    return {
        "backends": processes_cpu_s(backends),
        "backends seen": len(backends),
        "background": processes_cpu_s(await background_pids(admin)),
        "drivers": processes_cpu_s(drivers),
        "machine": MachineCpu.read(),
        "lsn": await wal_lsn(admin),
        "other commits": await other_commits(admin, database),
    }


async def sample_machine(stop: asyncio.Event, saturated: list[bool]) -> None:
    """Whether each interval had no idle CPU left (under 5% of one interval idle)."""
    previous = MachineCpu.read()
    while not stop.is_set():
        await asyncio.sleep(SAMPLE_EVERY_S)  # the sampling interval
        now = MachineCpu.read()
        spent = now.minus(previous)
        saturated.append(spent.idle_s < 0.05 * SAMPLE_EVERY_S)
        previous = now


async def fresh_runs(store: jobrun.SqlJobRunStore, admin: Any, count: int) -> None:
    """No runs, steps or dead rows left from the point before; ``count`` due runs."""
    await admin.execute("DELETE FROM _substrat_job_steps")
    await admin.execute("DELETE FROM _substrat_job_runs")
    await admin.execute("VACUUM ANALYZE _substrat_job_runs, _substrat_job_steps")
    await asyncio.gather(
        *(
            jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, instance=uuid.uuid4().hex)
            for _ in range(count)
        )
    )


async def measure(args: Any, admin: Any, url: str, processes: int, steps: int) -> dict[str, Any]:
    """One point: ``processes`` drivers for ``args.seconds``; what they did and what it cost."""
    database = str(make_url(url).database)
    context = multiprocessing.get_context("spawn")
    pipes, children = [], []
    for _ in range(processes):
        ours, theirs = context.Pipe()
        child = context.Process(
            target=driver_process,
            args=(
                url,
                args.in_flight,
                steps,
                args.seconds,
                args.count_statements,
                theirs,
            ),
        )
        child.start()
        pipes.append(ours)
        children.append(child)
    try:
        for pipe in pipes:
            assert await asyncio.to_thread(pipe.recv) == "ready"
        pids = [child.pid for child in children if child.pid is not None]
        before = await snapshot(admin, database, pids)
        stop, saturated = asyncio.Event(), []
        sampler = asyncio.create_task(sample_machine(stop, saturated))
        started = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        counted: Counter[str] = Counter()
        for pipe in pipes:
            counted.update(await asyncio.to_thread(pipe.recv))
        wall_s = time.perf_counter() - started
        stop.set()
        await sampler
        after = await snapshot(admin, database, pids)
        wal_all = await wal_bytes(admin, before["lsn"], after["lsn"])
    finally:
        for pipe in pipes:
            pipe.send("close")
        for child in children:
            child.join(timeout=60)
    return {
        "counted": dict(counted),
        "wall_s": wall_s,
        "before": before,
        "after": after,
        "wal_all": wal_all,
        "saturated": saturated,
    }


def figures(measured: dict[str, Any], steps: int, database_wal: int | None) -> dict[str, Any]:
    """Rates, CPU and WAL per step and per pass, and how the machine's CPU was shared."""
    before, after, wall_s = measured["before"], measured["after"], measured["wall_s"]
    passes = measured["counted"].get("passes", 0)
    done_steps = passes * steps
    machine = after["machine"].minus(before["machine"])
    capacity_s = machine.busy_s + machine.idle_s
    spent = {
        part: spent_between(before[part], after[part])
        for part in ("backends", "background", "drivers")
    }
    # Not visible from here: a server on another host or in another pid namespace.
    visible = bool(after["backends"])
    found = {
        "steps_per_s": done_steps / wall_s,
        "passes_per_s": passes / wall_s,
        "passes": passes,
        "not_committed": measured["counted"].get("not committed", 0),
        "found_nothing_due": measured["counted"].get("found nothing due", 0),
        "wall_s": wall_s,
        "backends_seen": after["backends seen"],
        "machine_busy_share": machine.busy_share,
        "saturated_share": statistics.fmean(measured["saturated"] or [0.0]),
        "other_database_commits": after["other commits"] - before["other commits"],
        "driver_share": spent["drivers"] / capacity_s,
        "backend_share": spent["backends"] / capacity_s if visible else None,
        "background_share": spent["background"] / capacity_s if visible else None,
    }
    for name, sent in measured["counted"].items():
        if name.startswith("statements: "):
            found[f"{name.removeprefix('statements: ')} statements per pass"] = sent / passes
    per = {"step": done_steps, "pass": passes}
    for unit, count in per.items():
        found[f"driver_cpu_us_per_{unit}"] = spent["drivers"] * 1e6 / count
        found[f"backend_cpu_us_per_{unit}"] = spent["backends"] * 1e6 / count if visible else None
        found[f"background_cpu_us_per_{unit}"] = (
            spent["background"] * 1e6 / count if visible else None
        )
        found[f"wal_bytes_per_{unit}"] = measured["wal_all"] / count
        found[f"database_wal_bytes_per_{unit}"] = (
            None if database_wal is None else database_wal / count
        )
    return found


def medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds (None where it could not be measured)."""
    names = {name: None for sample in samples for name in sample}
    return {
        name: None
        if any(sample.get(name) is None for sample in samples)
        else statistics.median(sample[name] for sample in samples)
        for name in names
    }


def marginal(
    steps_point: dict[str, Any], passes_point: dict[str, Any], steps: int
) -> dict[str, Any]:
    """One more step, and a pass's own cost (claim and commit), from the two workloads
    at one process count: a pass of ``steps`` steps against a pass of one."""
    found: dict[str, Any] = {}
    for cost in ("backend_cpu_us", "driver_cpu_us", "database_wal_bytes", "wal_bytes"):
        many, one = steps_point[f"{cost}_per_pass"], passes_point[f"{cost}_per_pass"]
        if many is None or one is None:
            found[f"{cost}_per_step"] = found[f"{cost}_per_pass_alone"] = None
            continue
        step = (many - one) / (steps - 1)
        found[f"{cost}_per_step"] = step
        found[f"{cost}_per_pass_alone"] = one - step
    return found


def cell(value: Any, digits: int = 0, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:.0f}%" if percent else f"{value:,.{digits}f}"


MAIN_HEADER = [
    "workload",
    "processes",
    "steps/s",
    "passes/s",
    "server CPU µs: backends / background",
    "drivers CPU µs",
    "WAL bytes: this database / all",
    "CPU share: backends / drivers / machine busy",
    "time saturated",
]
MARGINAL_HEADER = [
    "processes",
    "server µs/step",
    "server µs/pass alone",
    "drivers µs/step",
    "drivers µs/pass alone",
    "WAL bytes/step",
    "WAL bytes/pass alone",
]


def point_row(workload: str, unit: str, processes: int, point: dict[str, Any]) -> list[Any]:
    """One point's cells, per step (steps workload) or per pass (passes workload)."""
    return [
        workload,
        processes,
        cell(point["steps_per_s"]),
        cell(point["passes_per_s"]),
        f"{cell(point[f'backend_cpu_us_per_{unit}'], 1)} / "
        f"{cell(point[f'background_cpu_us_per_{unit}'], 1)}",
        cell(point[f"driver_cpu_us_per_{unit}"], 1),
        f"{cell(point[f'database_wal_bytes_per_{unit}'])} / {cell(point[f'wal_bytes_per_{unit}'])}",
        f"{cell(point['backend_share'], percent=True)} / "
        f"{cell(point['driver_share'], percent=True)} / "
        f"{cell(point['machine_busy_share'], percent=True)}",
        cell(point["saturated_share"], percent=True),
    ]


def report(points: dict[str, dict[str, Any]], counts: list[int], steps: int) -> dict[str, Any]:
    """Print both tables; return the marginal figures per process count."""
    rows = [
        point_row(workload, unit, processes, points[f"{workload}-{processes}"])
        for workload, unit in (("steps", "step"), ("passes", "pass"))
        for processes in counts
    ]
    harness.table(
        f"one Postgres: steps/s and passes/s by driver processes ({steps} steps per pass in "
        "'steps', one in 'passes'; costs per step in 'steps', per pass in 'passes')",
        MAIN_HEADER,
        rows,
    )
    derived, extra = {}, []
    for processes in counts:
        found = marginal(points[f"steps-{processes}"], points[f"passes-{processes}"], steps)
        derived[str(processes)] = found
        costs = ("backend_cpu_us", "driver_cpu_us", "database_wal_bytes")
        extra.append(
            [processes]
            + [
                cell(found[f"{cost}_{per}"], 0 if cost == "database_wal_bytes" else 1)
                for cost in costs
                for per in ("per_step", "per_pass_alone")
            ]
        )
    statements_table(points, counts)
    harness.table(
        "one more step, and a pass alone (claim + commit), from the two workloads",
        MARGINAL_HEADER,
        extra,
    )
    return derived


def statements_table(points: dict[str, dict[str, Any]], counts: list[int]) -> None:
    """With ``--count-statements``: the statements a pass sent, by store operation."""
    suffix = " statements per pass"
    operations = sorted(
        {name for point in points.values() for name in point if name.endswith(suffix)}
    )
    if not operations:
        return
    rows = [
        [workload, processes]
        + [cell(points[f"{workload}-{processes}"].get(name), 2) for name in operations]
        for workload in ("steps", "passes")
        for processes in counts
    ]
    header = ["workload", "processes"] + [name.removesuffix(suffix) for name in operations]
    harness.table("statements sent per committed pass, by store operation", header, rows)


async def sweep(
    args: Any, store: jobrun.SqlJobRunStore, admin: Any, url: str, counts: list[int]
) -> tuple[dict[str, list[dict[str, Any]]], WalReader]:
    """Every point once per round, the order reversed every other round."""
    workloads = {"steps": args.steps, "passes": 1}
    wal_reader = await WalReader.open(admin, str(make_url(url).database))

    def point(workload: str, processes: int) -> Any:
        rounds_done = itertools.count(1)

        async def sample() -> dict[str, Any]:
            await fresh_runs(store, admin, RUNS_PER_TASK * processes * args.in_flight)
            measured = await measure(args, admin, url, processes, workloads[workload])
            lsns = measured["before"]["lsn"], measured["after"]["lsn"]
            database_wal = await wal_reader.database_bytes(admin, *lsns)
            found = figures(measured, workloads[workload], database_wal)
            print(
                f"round {next(rounds_done)}: {workload}, {processes} processes: "
                f"{found['steps_per_s']:,.0f} steps/s, {found['passes_per_s']:,.0f} passes/s"
            )
            return found

        return sample

    plan = {
        f"{workload}-{processes}": point(workload, processes)
        for processes in counts
        for workload in workloads
    }
    rounds = args.rounds or (1 if args.quick else 2)
    samples = await harness.interleave_samples(plan, rounds, warm_ups=0, collect=False)
    return samples, wal_reader


async def scenario(args: Any) -> None:
    if args.sqlite_only:
        sys.exit("the postgres_ceiling scenario measures Postgres only: leave out --sqlite-only")
    if args.quick:
        args.processes, args.seconds, args.in_flight, args.steps = "1,2", 1.0, 2, 5
    if args.steps < 2:
        sys.exit(
            f"--steps must be at least 2 (one more step is priced against a pass of one), "
            f"got {args.steps}"
        )
    counts = [int(count) for count in args.processes.split(",")]
    load_before = harness.load()
    engine = await args.databases.engine("postgres")
    admin = await asyncpg.connect(
        harness.driver_dsn(engine), server_settings={"application_name": f"{APPLICATION}-admin"}
    )
    try:
        store = jobrun.SqlJobRunStore(engine)
        url = engine.url.render_as_string(hide_password=False)
        samples, wal_reader = await sweep(args, store, admin, url, counts)
    finally:
        await admin.close()
        await engine.dispose()
    points = {key: medians(values) for key, values in samples.items()}
    settings = {
        "processes": counts,
        "in_flight_per_process": args.in_flight,
        "steps_per_pass": args.steps,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "wal_attributed_by_pg_waldump": wal_reader.usable,
        "wal_attribution_last_error": wal_reader.last_error,
    }
    found = {"settings": settings, "load_before": load_before, "points": points}
    found["marginal"] = report(points, counts, args.steps)
    found |= {"load_after": harness.load(), "samples": samples}
    harness.save(args, found)


if __name__ == "__main__":
    harness.run(
        scenario, steps=50, in_flight=8, seconds=6.0, processes="1,2,4,8", count_statements=False
    )
