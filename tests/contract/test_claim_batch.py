"""Batch claims, and claimers that never wait on each other.

A driver with k free slots asks for up to k runs in one call (``claim_batch``):
each run gets its own lease under its own token, and the batch follows every
rule one claim follows, as if its runs were claimed one after another (the
memory store does exactly that, with the rules' Python homes: it is the oracle
here). On Postgres the batch is one statement that passes over the rows other
claimers have locked instead of waiting for them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from sqlalchemy import insert, select, text

import jobrun
from jobrun._core.leases.claims import Claimed
from jobrun._core.model.records import ClaimRequest, RunPatch, RunRow
from jobrun._testing.memory import MemoryJobRunStore
from jobrun.sql.schema import job_runs, job_steps
from tests.support import hand_made_row, logged_store, put_rows

BEFORE = "2026-01-01T11:00:00.000Z"
NOW = "2026-01-01T12:00:00.000Z"
LATER = "2026-01-01T13:00:00.000Z"
A = ("m", "a")
B = ("m", "b")
ONLY_POSTGRES = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)
# Bounds a hang only: a claim that does not wait returns in milliseconds.
HANG_S = 60


def _due(index: int, job: tuple[str, str] = A, **values: Any) -> RunRow:
    row = hand_made_row(index, module_id=job[0], job=job[1], at=BEFORE)
    return dataclasses.replace(row, **values)


def _request(token: str = "unused", **values: Any) -> ClaimRequest:
    return ClaimRequest(NOW, token, "me:1", {A: LATER, B: LATER}, **values)


async def _batch_on_memory(rows: list[RunRow], request: ClaimRequest, tokens: list[str]) -> Any:
    """What the rules' Python homes make of the batch (the oracle)."""
    oracle = MemoryJobRunStore()
    await put_rows(oracle, None, rows)
    return await oracle.claim_batch(request, tokens)


def _written(claimed: list[Claimed]) -> list[tuple[RunRow, Any]]:
    """What a claim wrote and whom it took over (whether it knew the ledger empty is
    the store's to know: Postgres says so, the others read the ledger)."""
    return [(one.row, one.previous) for one in claimed]


def _rows_to_rules() -> list[RunRow]:
    """Rows that put each rule to work: priority, a limit already half used, a
    version newer than the code's, a run to pass over, an orphan, a run not yet due."""
    return [
        _due(1),
        _due(2, priority=5),
        _due(3, priority=1),
        _due(4),
        _due(5, B, priority=9, job_version=3),  # newer than the code's version 2
        _due(6, B),
        _due(7, B, priority=2),  # passed over: in skip_ids
        _due(8, B, next_attempt_at=LATER),  # not due yet
        # Leased by a driver proven dead: first, and outside the limit.
        _due(9, lease_owner="DEAD", lease_driver="gone:1", next_attempt_at=LATER),
        # Leased by a live driver: one of job a's places in flight.
        _due(10, lease_owner="ALIVE", lease_driver="here:1", next_attempt_at=LATER),
    ]


@pytest.mark.parametrize("by_age", [False, True])
async def test_a_batch_follows_every_rule_as_claims_one_after_another(
    store: Any, engine: Any, by_age: bool
) -> None:
    rows = _rows_to_rules()
    await put_rows(store, engine, rows)
    request = _request(
        skip_ids=frozenset({rows[6].id}),
        max_concurrent={A: 3},
        dead_owners=frozenset({"DEAD"}),
        by_age=by_age,
        versions={B: 2},
    )
    tokens = [f"T{index}" for index in range(6)]
    claimed = await store.claim_batch(request, tokens)
    wanted = await _batch_on_memory(rows, request, tokens)
    assert _written(claimed) == _written(wanted)
    # The orphan, then one of job a (its limit of 3 counts both leased runs, and the
    # batch's own), then job b's one runnable run: fewer runs than tokens.
    assert len(claimed) == 3
    assert claimed[0].row.id == rows[8].id
    assert claimed[0].previous is not None
    assert claimed[0].previous.died


async def test_each_run_of_a_batch_has_its_own_lease(store: Any, engine: Any) -> None:
    rows = [_due(index, priority=index) for index in range(1, 6)]
    await put_rows(store, engine, rows)
    tokens = ["T0", "T1", "T2"]
    claimed = await store.claim_batch(_request(), tokens)
    # Highest priority first, each under its own token, each epoch raised once.
    assert [taken.row.id for taken in claimed] == [rows[4].id, rows[3].id, rows[2].id]
    assert [taken.row.lease_owner for taken in claimed] == tokens
    assert all(taken.row.lease_epoch == 1 and not taken.taken_over for taken in claimed)
    # Each token fences its own run only.
    first, second = claimed[0].row, claimed[1].row
    assert not await store.patch(first.id, _patch_of(first), "T1")
    assert await store.patch(first.id, _patch_of(first), "T0")
    assert await store.patch(second.id, _patch_of(second), "T1")
    # The rest are still due, and claimed next.
    rest = await store.claim_batch(_request(), ["U0", "U1", "U2"])
    assert [taken.row.id for taken in rest] == [rows[1].id, rows[0].id]


def _patch_of(row: RunRow) -> RunPatch:
    return RunPatch(**{name: getattr(row, name) for name in RunPatch.__dataclass_fields__})


async def test_concurrent_batches_never_claim_one_run_twice(store: Any, engine: Any) -> None:
    rows = [_due(index, priority=index % 3) for index in range(1, 25)]
    await put_rows(store, engine, rows)
    batches = await asyncio.gather(
        *(
            store.claim_batch(_request(), [f"T{claimer}-{slot}" for slot in range(4)])
            for claimer in range(8)
        )
    )
    taken: list[Claimed] = [one for batch in batches for one in batch]
    ids = [one.row.id for one in taken]
    assert len(ids) == len(set(ids)) == len(rows)
    assert len({one.row.lease_owner for one in taken}) == len(rows)


@ONLY_POSTGRES
async def test_a_claim_passes_over_a_run_another_transaction_has_locked(
    store: Any, engine: Any
) -> None:
    """Postgres only: row locks are how its claimers meet (SQLite has one writer at a
    time by design, so there a claim waits for the writer and nothing else). A
    claimer that has locked the first run in claim order and not yet committed
    does not hold up another claimer: that one takes the next due run. (The
    claim before SKIP LOCKED read the locked run and waited on its lock.)"""
    first, second = _due(1, priority=1), _due(2)
    await put_rows(store, engine, [first, second])
    async with engine.connect() as holder:
        transaction = await holder.begin()
        locked = select(job_runs.c.id).where(job_runs.c.id == first.id).with_for_update()
        assert (await holder.execute(locked)).scalar_one() == first.id
        claimed = await asyncio.wait_for(store.claim(_request(token="T")), HANG_S)
        assert claimed is not None
        assert claimed.row.id == second.id
        # Nothing else is due: the locked run is passed over, not waited for.
        assert await asyncio.wait_for(store.claim(_request(token="U")), HANG_S) is None
        await transaction.rollback()
    again = await store.claim(_request(token="V"))
    assert again is not None
    assert again.row.id == first.id


@ONLY_POSTGRES
async def test_the_claim_text_is_the_same_whatever_it_skips(engine: Any) -> None:
    """Postgres: the lists a claim carries (runs to pass over, dead holders, tokens)
    are array parameters, so one driver's claims are one statement text and
    asyncpg's prepared statement is reused."""
    logged, log = logged_store(engine)
    await put_rows(logged, engine, [_due(index) for index in range(1, 8)])
    await logged.claim(_request(token="T"))
    await logged.claim(_request(token="U", skip_ids=frozenset({"x", "y"})))
    await logged.claim_batch(
        _request(dead_owners=frozenset({"D"}), skip_ids=frozenset({"z"})), ["V", "W", "X"]
    )
    await logged.claim_batch(_request(dead_owners=frozenset({"D", "E", "F"})), ["V1", "W1"])
    claims = [sql for operation, sql, _ in log.seen if operation == "claim"]
    assert len(claims) == 4
    # One text without dead holders, one with, whatever the lists' lengths.
    assert len(set(claims)) == 2
    async with engine.connect() as connection:
        held = await connection.execute(
            text("SELECT count(*) FROM _substrat_job_runs WHERE lease_owner IS NOT NULL")
        )
        assert held.scalar_one() == 7


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_sqlite_claim_text_is_the_same_however_many_runs_it_skips(engine: Any) -> None:
    """SQLite: the runs a drive passes over are one JSON parameter, so its claims are
    one statement text whatever the list's length (a text per length was compiled
    again on every claim of a drive, the list growing by one run each time), and
    the runs listed are passed over."""
    logged, log = logged_store(engine)
    await put_rows(logged, engine, [_due(index) for index in range(1, 8)])
    skipped = frozenset(hand_made_row(index).id for index in (1, 2, 3))
    first = await logged.claim(_request(token="T", skip_ids=skipped))
    assert first is not None
    assert first.row.id == hand_made_row(4).id
    second = await logged.claim(_request(token="U", skip_ids=skipped | {first.row.id, "x"}))
    assert second is not None
    assert second.row.id == hand_made_row(5).id
    reads = [sql for operation, sql, _ in log.seen if operation == "claim" and "SELECT" in sql[:7]]
    assert len(reads) == 2
    assert len(set(reads)) == 1


@ONLY_POSTGRES
async def test_a_claim_knows_an_empty_ledger_and_the_pass_does_not_read_it(engine: Any) -> None:
    """Postgres: a run claimed unleased, with no ledger rows, comes back
    ``ledger_empty`` and its first pass sends no ledger read; a run with ledger
    rows, or taken over from a holder (whose writes may still land), does not."""
    logged, log = logged_store(engine)
    fresh, kept, expired = _due(1, priority=2), _due(2, priority=1), _due(3)
    expired = dataclasses.replace(
        expired, lease_owner="GONE", lease_driver="gone:1", next_attempt_at=BEFORE
    )
    await put_rows(logged, engine, [fresh, kept, expired])
    async with engine.begin() as connection:
        await connection.execute(
            insert(job_steps),
            [
                {
                    "run_id": kept.id,
                    "step": "s",
                    "result": '"memo"',
                    "attempts": 1,
                    "last_error": None,
                    "recorded_at": BEFORE,
                }
            ],
        )
    claimed = await logged.claim_batch(_request(), ["T0", "T1", "T2"])
    assert [(one.row.id, one.ledger_empty) for one in claimed] == [
        (fresh.id, True),
        (kept.id, False),
        (expired.id, False),
    ]
    # A pass of a run claimed so reads no ledger before its step.
    registry = jobrun.JobRegistry()

    @registry.job(*B)
    async def one_step(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("only", lambda: 1)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(logged, module_id=B[0], job=B[1], instance="new")
    log.seen.clear()
    report = await jobrun.run_due_jobs(logged, registry, limit=1)
    assert report.completed == 1
    assert [operation for operation, _, _ in log.seen].count("steps") == 0
    assert [operation for operation, _, _ in log.seen].count("record_step") == 1
