"""The fence for the outside world on every backend: ``p.lease_epoch`` grows with every
claim and every lease handed on; ``p.idempotency_key(name)`` is the same for every
replay of a pass (a retry, a takeover, a resume) and new in the next pass."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun.testing import crash_after_step, drive_until_idle
from tests.support import JOB, MODULE_ID, claim_as, drive, hand_made_row, registry_for, row_of

KEY_SHAPE = re.compile(r"[0-9A-Z]{26}-p[0-9]+-[0-9a-f]{16}")


class Seen:
    """What each pass saw: its epoch, its lease token (as stored), its key for one name."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.passes: list[tuple[int, str | None, str]] = []

    async def note(self, p: jobrun.JobPass) -> str:
        row = await self.store.get(p.run.id)
        key = p.idempotency_key("charge-42")
        self.passes.append((p.lease_epoch, row.lease_owner, key))
        return key

    def epochs(self) -> list[int]:
        return [epoch for epoch, _, _ in self.passes]

    def keys(self) -> list[str]:
        return [key for _, _, key in self.passes]


async def test_the_epoch_grows_with_every_claim_and_every_lease_handed_on(store, clock):
    seen = Seen(store)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await seen.note(p)
        cursor = (p.cursor or 0) + 1
        return jobrun.PassResult(cursor=cursor, done=cursor == 4)

    run_id = (await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, clock=clock)).id
    # Three passes under one claim (the lease handed on twice), then a fresh claim.
    assert (await drive(store, registry_for(handler), clock, max_passes=3)).advanced == 3
    assert (await drive(store, registry_for(handler), clock)).completed == 1
    assert seen.epochs() == [1, 2, 3, 4]
    # Epoch order is token order (ULIDs sort in mint order), whichever way the lease came.
    tokens = [token for _, token, _ in seen.passes]
    assert len(set(tokens)) == 4
    assert sorted(tokens) == tokens
    keys = seen.keys()
    assert len(set(keys)) == 4, "every pass gets a key of its own"
    assert [key.split("-")[:2] for key in keys] == [[run_id, f"p{n}"] for n in (1, 2, 3, 4)]
    record = await jobrun.get_job_run(store, run_id)
    assert record is not None
    assert (record.status, record.lease_epoch, record.passes_committed) == ("done", 4, 4)


async def test_a_takeover_gets_a_higher_epoch_and_replays_the_same_key(store, clock):
    """A pass killed after its first step is taken over when its lease expires: the new
    holder's epoch is higher, its idempotency key the same (the same pass, replayed)."""
    seen = Seen(store)
    charged: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        key = await seen.note(p)
        await p.step("fetch", lambda: 1)
        await p.step("charge", lambda: charged.append(key))
        return jobrun.PassResult(cursor="charged", done=p.cursor is not None)

    await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, clock=clock)
    report = await drive_until_idle(
        store, registry_for(handler), clock=clock, crash=crash_after_step(1)
    )
    assert report.crashes == 1
    assert report.outcomes() == ["interrupted", "advanced", "completed"]
    assert seen.epochs() == [1, 2, 3]
    first, replay, following = seen.keys()
    assert replay == first, "the takeover replays the same pass"
    assert following != first
    assert charged == [first, following]


async def test_a_failed_pass_retried_or_resumed_keeps_its_key(store, clock):
    seen = Seen(store)
    failures = [ConnectionError("payments unreachable")] * 2

    def charge() -> str:
        if failures:
            raise failures.pop()
        return "paid"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await seen.note(p)
        await p.step("charge", charge)
        return jobrun.PassResult(cursor="next")

    retry = jobrun.RetryPolicy(max_attempts=2, base_delay_ms=1000)
    registry = registry_for(handler, retry=retry)
    run_id = (await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, clock=clock)).id
    assert (await drive(store, registry, clock)).retrying == 1
    clock.advance(seconds=2)
    assert (await drive(store, registry, clock)).failed == 1
    # The operator resumes the failed run: still the same pass.
    await jobrun.resume_job_run(store, run_id, clock=clock)
    assert (await drive(store, registry, clock)).advanced == 1
    assert (await drive(store, registry, clock)).advanced == 1
    assert seen.epochs() == [1, 2, 3, 4]
    keys = seen.keys()
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert all(KEY_SHAPE.fullmatch(key) for key in keys), keys
    row = await row_of(store, run_id)
    assert (row.lease_epoch, row.passes_committed) == (4, 2)


async def test_a_failure_hand_back_and_claims_keep_the_pass_count(store, clock):
    """Only a commit counts a pass; a claim that takes an expired lease over raises the
    epoch it found, the one the store compares and sets."""
    run_id = (await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)).id
    first = await claim_as(store, clock, "ZOMBIE", job=("m", "j"))
    assert first is not None
    assert (first.lease_epoch, first.passes_committed) == (1, 0)
    clock.advance(seconds=2)
    second = await claim_as(store, clock, "HEIR", job=("m", "j"))
    assert second is not None
    assert (second.lease_epoch, second.passes_committed, second.lease_takeovers) == (2, 0, 1)
    assert await jobrun.release_job_lease(store, run_id)
    third = await claim_as(store, clock, "THIRD", job=("m", "j"))
    assert third is not None
    assert (third.lease_epoch, third.passes_committed) == (3, 0)
    assert (await row_of(store, run_id)).lease_epoch == 3


class _Stopped(BaseException):
    """Stands for the host stopping the pass: the lease is handed back, as is."""


async def test_a_lease_handed_back_or_deferred_keeps_its_epoch(store, clock):
    """A hand-back (the pass stopped) and a deferral give the lease up without a commit:
    the epoch stays as claimed, so the next claim is higher still, never back at 1."""
    seen = Seen(store)
    endings: list[BaseException] = [_Stopped(), jobrun.RetryAfter(0, reason="busy")]

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await seen.note(p)
        if endings:
            raise endings.pop(0)
        return jobrun.PassResult(done=True)

    run_id = (await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, clock=clock)).id
    with pytest.raises(_Stopped):
        await drive(store, registry_for(handler), clock)
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.lease_epoch) == (None, 1)
    assert (await drive(store, registry_for(handler), clock)).deferred == 1
    row = await row_of(store, run_id)
    assert (row.lease_owner, row.lease_epoch) == (None, 2)
    assert (await drive(store, registry_for(handler), clock)).completed == 1
    assert seen.epochs() == [1, 2, 3]
    assert (await row_of(store, run_id)).lease_epoch == 3


async def _insert_as_an_older_writer(store: Any, engine: AsyncEngine | None, row: Any) -> None:
    """Insert a run as a writer that does not know revision 0004's columns would."""
    values = asdict(row)
    del values["lease_epoch"], values["passes_committed"]
    if engine is None:
        store.runs[row.id] = row
        return
    columns = ", ".join(values)
    placeholders = ", ".join(f":{name}" for name in values)
    async with engine.begin() as connection:
        await connection.execute(
            text(f"INSERT INTO _substrat_job_runs ({columns}) VALUES ({placeholders})"), values
        )


async def test_a_run_written_without_the_new_columns_starts_at_zero(store, engine, clock):
    row = hand_made_row(7, module_id=MODULE_ID, job=JOB, at="2025-12-31T00:00:00.000Z")
    await _insert_as_an_older_writer(store, engine, row)
    record = await jobrun.get_job_run(store, row.id)
    assert record is not None
    assert (record.lease_epoch, record.passes_committed) == (0, 0)
    seen = Seen(store)

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await seen.note(p)
        return jobrun.PassResult(cursor="on")

    assert (await drive(store, registry_for(handler), clock)).advanced == 1
    assert seen.epochs() == [1]
    assert seen.keys()[0].startswith(f"{row.id}-p1-")
    stored = await row_of(store, row.id)
    assert (stored.lease_epoch, stored.passes_committed) == (1, 1)


async def test_idempotency_key_checks_its_name_like_a_step(store, clock):
    long_name = "é" * 256  # 512 bytes of UTF-8: the longest name there is
    keys: list[str] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        keys.append(p.idempotency_key(long_name))
        keys.append(p.idempotency_key(long_name))
        keys.append(p.idempotency_key("another"))
        for bad, problem in ((42, "of type int"), ("", "is empty"), ("a\x00b", "NUL")):
            with pytest.raises(jobrun.HandlerMistakeError, match=problem):
                p.idempotency_key(bad)  # type: ignore[arg-type]
        p.idempotency_key(long_name + "é")
        raise AssertionError("a name over 512 bytes was accepted")

    run_id = (await jobrun.start_job_run(store, module_id=MODULE_ID, job=JOB, clock=clock)).id
    report = await drive(store, registry_for(handler), clock)
    # The too-long name is a handler mistake: the run fails at once, saying why.
    assert report.failed == 1
    assert "over the 512-byte limit" in report.errors[0].error
    assert keys[0] == keys[1] != keys[2]
    assert all(len(key) <= 64 and key.isascii() for key in keys)
    assert all(KEY_SHAPE.fullmatch(key) for key in keys), keys
    assert keys[0].startswith(f"{run_id}-p1-")
