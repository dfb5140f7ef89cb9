"""Starting many runs at once (``start_job_runs``), starting later, and saying whether a
start joined: issue 34 items 1, 3 and 4 (issue 32 item 4), on memory, SQLite and Postgres."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import jobrun
from jobrun._core.model.predicates import starts_later_at
from jobrun._core.operator.waiting import waiting_of
from tests.contract.test_start import count_rows
from tests.support import JOB, MODULE_ID, start


def one(instance: str, **kw: Any) -> jobrun.JobStart:
    return jobrun.JobStart(module_id=MODULE_ID, job=JOB, instance=instance, **kw)


def registry_done() -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    registry.register(MODULE_ID, JOB, lambda p: jobrun.PassResult(done=True))
    return registry


# -- joined ---------------------------------------------------------------------------------


async def test_a_new_run_says_it_was_not_joined_and_a_second_start_says_it_joined(store, clock):
    first = await start(store, clock, payload={"wave": 1})
    second = await start(store, clock, payload={"wave": 2})

    assert first.joined is False
    assert second.joined is True
    assert second.id == first.id
    # Not part of equality: the record a start returns equals the one read back.
    assert await jobrun.get_job_run(store, first.id) == first == second
    assert (await jobrun.get_job_run(store, first.id)).joined is False


async def test_a_start_after_the_run_ended_makes_a_new_run_not_joined(store, clock):
    first = await start(store, clock)
    await jobrun.run_due_jobs(store, registry_done(), clock=clock)

    again = await start(store, clock)

    assert again.id != first.id
    assert again.joined is False


# -- start many -----------------------------------------------------------------------------


async def test_a_batch_of_new_keys_makes_one_run_each_in_order(store, engine, clock):
    starts = [one(f"shop-{n}", payload={"n": n}, priority=n % 3) for n in range(40)]

    runs = await jobrun.start_job_runs(store, starts, clock=clock)

    assert [run.instance for run in runs] == [f"shop-{n}" for n in range(40)]
    assert [run.payload for run in runs] == [{"n": n} for n in range(40)]
    assert [run.priority for run in runs] == [n % 3 for n in range(40)]
    assert [run.joined for run in runs] == [False] * 40
    assert [run.id for run in runs] == sorted(run.id for run in runs)
    for run in runs:
        assert await jobrun.get_job_run(store, run.id) == run
    if engine is not None:
        assert await count_rows(engine, live_only=True) == 40


async def test_a_batch_joins_live_keys_and_starts_the_rest(store, engine, clock):
    live = await start(store, clock, instance="b", payload="first")

    runs = await jobrun.start_job_runs(
        store, [one("a", payload=1), one("b", payload=2), one("c", payload=3)], clock=clock
    )

    assert [run.joined for run in runs] == [False, True, False]
    assert runs[1].id == live.id
    assert runs[1].payload == "first"
    assert runs[1] == await jobrun.get_job_run(store, live.id)
    if engine is not None:
        assert await count_rows(engine) == 3


async def test_a_key_twice_in_a_batch_makes_one_run_and_both_get_it(store, engine, clock):
    runs = await jobrun.start_job_runs(
        store, [one("x", payload="kept"), one("y"), one("x", payload="ignored")], clock=clock
    )

    assert runs[0] is runs[2]
    assert runs[0].payload == "kept"
    assert runs[0].joined is False
    assert len(await jobrun.job_runs(store)) == 2
    if engine is not None:
        assert await count_rows(engine) == 2


async def test_an_empty_batch_starts_nothing(store, clock):
    assert await jobrun.start_job_runs(store, [], clock=clock) == []
    assert await jobrun.job_runs(store) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (jobrun.JobStart(module_id="", job=JOB), "starts[2]: module_id"),
        (jobrun.JobStart(module_id=MODULE_ID, job=JOB, payload={1, 2}), "starts[2]: payload"),
        (jobrun.JobStart(module_id=MODULE_ID, job=JOB, priority=2**40), "starts[2]: priority"),
        (jobrun.JobStart(module_id=MODULE_ID, job=JOB, priority="1"), "starts[2]: priority"),  # type: ignore[arg-type]
        (jobrun.JobStart(module_id=MODULE_ID, job=JOB, payload="x" * 70_000), "starts[2]: payload"),
        (
            jobrun.JobStart(module_id=MODULE_ID, job=JOB, start_at=datetime(2030, 1, 1)),
            "starts[2]: start_at must be timezone-aware",
        ),
        ({"module_id": MODULE_ID, "job": JOB}, "starts[2] must be a JobStart, got dict"),
    ],
)
async def test_a_bad_start_is_named_by_its_index_and_nothing_is_written(
    store, engine, clock, bad, message
):
    with pytest.raises(jobrun.JobValidationError) as refused:
        await jobrun.start_job_runs(store, [one("a"), one("b"), bad, one("d")], clock=clock)

    assert str(refused.value).startswith(message)
    assert refused.value.errors[0]["path"].startswith("starts[2]")
    assert await jobrun.job_runs(store) == []
    if engine is not None:
        assert await count_rows(engine) == 0


async def test_starts_must_be_a_list_of_job_starts(store):
    with pytest.raises(jobrun.ArgumentTypeError, match="starts must be a list of JobStart"):
        await jobrun.start_job_runs(store, "not starts")  # type: ignore[arg-type]


def test_a_job_start_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        jobrun.JobStart(MODULE_ID, JOB)  # type: ignore[misc]
    made = jobrun.JobStart(module_id=MODULE_ID, job=JOB)
    assert (made.instance, made.payload, made.priority, made.start_at) == ("default", None, 0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.job = "other"  # type: ignore[misc]


# -- start later ----------------------------------------------------------------------------


async def test_a_run_started_later_is_live_at_once_but_not_due_until_then(store, clock):
    later = await start(store, clock, delay_s=60)
    assert later.next_attempt_at == clock.now() + timedelta(seconds=60)

    joined = await start(store, clock, payload="second")
    report = await jobrun.run_due_jobs(store, registry_done(), clock=clock)
    health = await jobrun.job_run_health(store, clock=clock)

    assert joined.id == later.id
    assert joined.joined is True
    assert report.attempted == 0
    assert (health.running, health.due, health.oldest_due_age_s) == (1, 0, 0.0)
    # What the console and `jobrun show` say of it.
    waiting = waiting_of(later, clock.now())
    assert waiting is not None
    assert (waiting.kind, waiting.at) == ("later", later.next_attempt_at)
    assert waiting.reason == "started to start later (start_at or delay_s)"
    assert starts_later_at(later) == later.next_attempt_at

    clock.advance(seconds=60)
    report = await jobrun.run_due_jobs(store, registry_done(), clock=clock)
    assert report.attempted == 1
    assert (await jobrun.get_job_run(store, later.id)).status == "done"


async def test_start_at_an_aware_instant_and_in_the_past_means_now(store, clock):
    at = clock.now() + timedelta(hours=2)
    later = await start(store, clock, instance="later", start_at=at.astimezone(UTC))
    past = await start(store, clock, instance="past", start_at=clock.now() - timedelta(days=1))

    assert later.next_attempt_at == at
    assert past.next_attempt_at is None
    report = await jobrun.run_due_jobs(store, registry_done(), clock=clock)
    assert report.attempted == 1


async def test_a_batch_start_later(store, clock):
    at = clock.now() + timedelta(minutes=5)
    runs = await jobrun.start_job_runs(store, [one("a", start_at=at), one("b")], clock=clock)

    assert [run.next_attempt_at for run in runs] == [at, None]
    report = await jobrun.run_due_jobs(store, registry_done(), clock=clock)
    assert report.attempted == 1
    assert (await jobrun.get_job_run(store, runs[0].id)).status == "running"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"start_at": datetime(2030, 1, 1)}, "start_at must be timezone-aware"),
        ({"start_at": "2030-01-01T00:00:00Z"}, "start_at must be an aware datetime, got str"),
        ({"delay_s": -1}, "delay_s must be a finite number of seconds, 0 or more"),
        ({"delay_s": float("inf")}, "delay_s must be a finite number"),
        (
            {"delay_s": 5, "start_at": datetime(2030, 1, 1, tzinfo=UTC)},
            "delay_s cannot be given with start_at",
        ),
    ],
)
async def test_a_bad_start_instant_is_refused_and_nothing_is_written(store, clock, given, message):
    with pytest.raises(jobrun.JobValidationError, match=message):
        await start(store, clock, **given)
    assert await jobrun.job_runs(store) == []
