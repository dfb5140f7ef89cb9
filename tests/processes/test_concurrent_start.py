"""Coalescing is atomic across processes (contract 8.9), on SQLite and on Postgres.

Eight OS processes, each with its own engine and several pooled connections,
wait on one barrier and then all start the same key at once. Exactly one live
run may come out, and every caller must be handed that run. The same processes
race again after the run is finished, which must give exactly one new run.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from tests.support import SQL_BACKENDS

PROCESSES = 8
CALLS_PER_PROCESS = 7  # 56 starts per round
CONNECTIONS_PER_PROCESS = 4
ROUNDS = 2
TIMEOUT = 60.0
KEY = {"module_id": "@test/jobs", "job": "walk", "instance": "race"}


def _racer(url: str, index: int, barrier: Any, results: Any) -> None:
    """One process: warm up, then at each barrier release start KEY many times at once."""
    asyncio.run(_race(url, index, barrier, results))


async def _race(url: str, index: int, barrier: Any, results: Any) -> None:
    engine = create_async_engine(
        url, pool_size=CONNECTIONS_PER_PROCESS, max_overflow=0, pool_timeout=TIMEOUT
    )
    try:
        store = jobrun.SqlJobRunStore(engine)
        # Schema check done and connections open before the race, so that the
        # starts themselves are what overlap.
        await asyncio.gather(*(store.get("0" * 26) for _ in range(CONNECTIONS_PER_PROCESS)))
        for round_ in range(ROUNDS):
            await asyncio.to_thread(barrier.wait, TIMEOUT)
            try:
                runs = await asyncio.gather(
                    *(
                        jobrun.start_job_run(store, **KEY, payload={"by": [index, call]})
                        for call in range(CALLS_PER_PROCESS)
                    )
                )
            except Exception as error:
                results.put((round_, index, None, f"{type(error).__name__}: {error}"))
            else:
                results.put((round_, index, [(run.id, run.payload) for run in runs], None))
    finally:
        await engine.dispose()


async def _key_rows(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT id, status FROM _substrat_job_runs "
                "WHERE module_id = :module_id AND job = :job AND instance = :instance ORDER BY id"
            ),
            KEY,
        )
        return [(row.id, row.status) for row in rows]


async def _finish(engine: AsyncEngine, run_id: str, status: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE _substrat_job_runs SET status = :status, ended_at = updated_at "
                "WHERE id = :id"
            ),
            {"status": status, "id": run_id},
        )


def _collect(results: Any, round_: int) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    for _ in range(PROCESSES):
        got_round, index, runs, error = results.get(timeout=TIMEOUT)
        assert got_round == round_
        assert error is None, f"process {index}: {error}"
        calls.extend(runs)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_many_processes_starting_one_key_get_one_live_run(
    database_url: str, engine: AsyncEngine
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES + 1)  # the racers and this test
    results = context.Queue()
    processes = [
        context.Process(target=_racer, args=(database_url, index, barrier, results), daemon=True)
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        earlier: set[str] = set()
        for round_ in range(ROUNDS):
            await asyncio.to_thread(barrier.wait, TIMEOUT)
            calls = await asyncio.to_thread(_collect, results, round_)
            assert len(calls) == PROCESSES * CALLS_PER_PROCESS

            rows = await _key_rows(engine)
            live = [run_id for run_id, status in rows if status == "running"]
            assert len(live) == 1, rows
            assert len(rows) == round_ + 1, "a losing starter left a row behind"
            (winner,) = live
            assert winner not in earlier
            # Every caller was handed the one live run, with the winner's payload.
            assert {run_id for run_id, _ in calls} == {winner}
            payloads = {repr(payload) for _, payload in calls}
            assert len(payloads) == 1
            stored = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), winner)
            assert stored is not None
            assert repr(stored.payload) in payloads

            # Finish it: the next round must start a new run rather than join this one.
            await _finish(engine, winner, "done")
            earlier.add(winner)
    finally:
        barrier.abort()
        for process in processes:
            process.join(timeout=TIMEOUT)
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        results.join_thread()
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    rows = await _key_rows(engine)
    assert [status for _, status in rows] == ["done"] * ROUNDS


@pytest.mark.parametrize("backend", SQL_BACKENDS)
@pytest.mark.parametrize("ending", ["done", "failed"])
async def test_a_finished_run_never_blocks_a_new_start(engine: AsyncEngine, ending: str) -> None:
    store = jobrun.SqlJobRunStore(engine)
    first = await jobrun.start_job_run(store, **KEY, payload=1)
    joined = await jobrun.start_job_run(store, **KEY, payload=2)
    assert (joined.id, joined.payload) == (first.id, 1)

    await _finish(engine, first.id, ending)
    second = await jobrun.start_job_run(store, **KEY, payload=3)
    assert second.id != first.id
    assert (second.status, second.payload) == ("running", 3)
    again = await jobrun.start_job_run(store, **KEY, payload=4)
    assert again.id == second.id
    assert await _key_rows(engine) == [(first.id, ending), (second.id, "running")]
