"""What a finished run costs on Postgres: bytes of the runs table and of each index.

Run on demand from the repository root (not part of the test suite; Postgres only)::

    .venv/bin/python -m benchmarks run_bytes                 # 20,000 runs
    .venv/bin/python -m benchmarks run_bytes --runs 100000
    JOBRUN_BENCH_CODE=/path/to/other/checkout .venv/bin/python -m benchmarks run_bytes

A new database (a unique name, dropped at the end) at the code's head; ``--runs``
runs of one job started in batches (payload ``{"n": i}``), each driven to done by
one pass of one step (eight drives at once), as a queue's runs are; then ``VACUUM
FULL`` of the runs and steps tables, so the figures are the rows and index entries
themselves, not the dead versions the passes left (those are reused by later
writes; the sizes as the passes left them are printed beside). Printed: bytes per
finished run of the table (heap and TOAST) and of each index, with the read each
index serves; and how many of the updates the passes made
were HOT (no index touched).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import text

import jobrun
from benchmarks import harness

RUNS = "_substrat_job_runs"
DRIVES = 8
# Backends report their statistics within a second or so of a commit; idle ones within 10 s.
STATISTICS_WAIT_S = 15
# What each index of the runs table is for (docs/design.md).
SERVES = {
    "_substrat_job_runs_pkey": "a run by id (every write's fence)",
    "_substrat_job_runs_key": "a key's history, newest first (console, CLI)",
    "_substrat_job_runs_live_key": "one live run per key (start's coalescing)",
    "_substrat_job_runs_claim_order": "the claim, by priority (live runs only)",
    "_substrat_job_runs_due_order": "the claim by age, one in eight (live runs only)",
    "_substrat_job_runs_leased": "per-job limits, proof of death (leased runs only)",
    "_substrat_job_runs_job_status": "a job's runs by status, newest first (console)",
    "_substrat_job_runs_status": "runs by status, newest first, and counts (console, health)",
    "_substrat_job_runs_ended": "the activity chart (finished per minute and hour)",
    "_substrat_job_runs_instance": "the instance prefix filter (console)",
}


async def _finish(store: jobrun.SqlJobRunStore, runs: int) -> None:
    for first in range(0, runs, 5_000):
        starts = [
            jobrun.JobStart(module_id="bench", job="bytes", instance=f"i{n}", payload={"n": n})
            for n in range(first, min(first + 5_000, runs))
        ]
        await jobrun.start_job_runs(store, starts)
    registry = jobrun.JobRegistry()

    @registry.job("bench", "bytes")
    async def one_step(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("one", lambda: 1)
        return jobrun.PassResult(done=True)

    async def drive() -> int:
        done = 0
        while (report := await jobrun.run_due_jobs(store, registry, limit=100)).attempted:
            done += report.completed
        return done

    assert sum(await asyncio.gather(*(drive() for _ in range(DRIVES)))) == runs


async def _relation_sizes(connection: Any, runs: int) -> tuple[float, dict[str, float]]:
    table = await connection.scalar(text(f"SELECT pg_table_size('{RUNS}')"))
    rows = await connection.execute(
        text(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) "
            f"FROM pg_index WHERE indrelid = '{RUNS}'::regclass"
        )
    )
    return table / runs, {name: size / runs for name, size in rows}


async def _update_counts(connection: Any, runs: int) -> tuple[int, int]:
    """(updates, HOT updates) of the runs table, once the passes' counts are in: each
    backend reports its counts to the statistics views a moment after it commits, so
    the read is repeated until it shows at least the two updates every run had (its
    claim and its pass's end), for at most ``STATISTICS_WAIT_S``."""
    query = text(
        f"SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '{RUNS}'"
    )
    deadline = time.monotonic() + STATISTICS_WAIT_S
    while True:
        # A new snapshot of the statistics on each read (else one per transaction).
        await connection.execute(text("SELECT pg_stat_clear_snapshot()"))
        updates, hot = (await connection.execute(query)).one()
        if updates >= 2 * runs or time.monotonic() > deadline:
            return int(updates), int(hot)
        await asyncio.sleep(0.1)  # the backends' reports arrive on their own timers


async def _sizes(engine: Any, runs: int) -> dict[str, Any]:
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as connection:
        updates = await _update_counts(connection, runs)
        left_table, left_indexes = await _relation_sizes(connection, runs)
        await connection.execute(text(f"VACUUM FULL {RUNS}"))
        await connection.execute(text("VACUUM FULL _substrat_job_steps"))
        table, indexes = await _relation_sizes(connection, runs)
    return {
        "table": table,
        "indexes": indexes,
        "total": table + sum(indexes.values()),
        "as_left": {"table": left_table, "indexes": left_indexes},
        "total_as_left": left_table + sum(left_indexes.values()),
        "updates": updates[0],
        "hot_updates": updates[1],
    }


async def scenario(args: Any) -> None:
    if "postgres" not in harness.backends(args):
        print("run_bytes measures Postgres only")
        return
    runs = 500 if args.quick else args.runs
    engine = await args.databases.engine("postgres")
    await _finish(jobrun.SqlJobRunStore(engine), runs)
    found = await _sizes(engine, runs)
    await engine.dispose()
    left = found["as_left"]
    rows = [["table (heap, TOAST)", f"{found['table']:.0f}", f"{left['table']:.0f}", "the run"]]
    for name, size in sorted(found["indexes"].items(), key=lambda item: -item[1]):
        rows.append([name, f"{size:.0f}", f"{left['indexes'][name]:.0f}", SERVES.get(name, "?")])
    rows.append(["**total**", f"{found['total']:.0f}", f"{found['total_as_left']:.0f}", ""])
    harness.table(
        f"bytes per finished run, {runs:,} runs (load {harness.load()[0]}); "
        f"HOT updates {found['hot_updates']:,} of {found['updates']:,}",
        ["relation", "after VACUUM FULL", "as the passes left it", "serves"],
        rows,
    )
    harness.save(args, {"runs": runs, **found})


if __name__ == "__main__":
    harness.run(scenario, runs=20_000)
