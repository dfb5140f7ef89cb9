"""Batches that share keys, from several OS processes at once (issue 32 item 4).

Four processes wait on one barrier, then each starts the same 60 keys with
``start_job_runs``, each in its own shuffled order and split into batches of its
own size. Exactly one live run per key may come out, every caller must be handed
that run, and no batch may fail (two batches inserting shared keys in different
orders would deadlock on Postgres: the store inserts in key order).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from tests.support import SQL_BACKENDS

PROCESSES = 4
KEYS = [f"shop-{n}" for n in range(60)]
TIMEOUT = 60.0  # bounds a hang only


def _racer(url: str, index: int, barrier: Any, results: Any) -> None:
    asyncio.run(_race(url, index, barrier, results))


async def _race(url: str, index: int, barrier: Any, results: Any) -> None:
    engine = create_async_engine(url, pool_size=2, max_overflow=0, pool_timeout=TIMEOUT)
    try:
        store = jobrun.SqlJobRunStore(engine)
        await store.get("0" * 26)  # the schema check and a connection, before the race
        order = random.Random(index).sample(KEYS, len(KEYS))  # seeded: a fixed shuffle
        size = 7 + 11 * index  # batches of 7, 18, 29 and 40 starts
        starts = [
            jobrun.JobStart(module_id="m", job="j", instance=key, payload=index) for key in order
        ]
        await asyncio.to_thread(barrier.wait, TIMEOUT)
        try:
            batches = [starts[first : first + size] for first in range(0, len(starts), size)]
            runs = [
                run for batch in await asyncio.gather(
                    *(jobrun.start_job_runs(store, batch) for batch in batches)
                ) for run in batch
            ]  # fmt: skip
        except Exception as error:
            results.put((index, None, f"{type(error).__name__}: {error}"))
        else:
            results.put((index, [(run.instance, run.id) for run in runs], None))
    finally:
        await engine.dispose()


def _collect(results: Any) -> list[tuple[str, str]]:
    handed: list[tuple[str, str]] = []
    for _ in range(PROCESSES):
        index, runs, error = results.get(timeout=TIMEOUT)
        assert error is None, f"process {index}: {error}"
        handed.extend(runs)
    return handed


async def _live_rows(engine: AsyncEngine) -> dict[str, list[str]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT instance, id FROM _substrat_job_runs WHERE status = 'running'")
        )
        found: dict[str, list[str]] = {}
        for instance, run_id in rows:
            found.setdefault(instance, []).append(run_id)
        return found


@pytest.mark.slow
@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_processes_starting_shared_keys_in_batches_get_one_live_run_per_key(
    database_url: str, engine: AsyncEngine
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=_racer, args=(database_url, index, barrier, results), daemon=True)
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        handed = await asyncio.to_thread(_collect, results)
    finally:
        barrier.abort()
        for process in processes:
            process.join(timeout=TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        results.join_thread()

    live = await _live_rows(engine)
    assert {key: len(ids) for key, ids in live.items()} == dict.fromkeys(KEYS, 1)
    assert len(handed) == PROCESSES * len(KEYS)
    for instance, run_id in handed:
        assert live[instance] == [run_id]
    assert [process.exitcode for process in processes] == [0] * PROCESSES
