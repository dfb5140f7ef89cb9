"""Schedules with an injected clock: each slot once, catch-up after downtime, validation.

Every test runs on the memory store, SQLite and Postgres (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.records import ScheduleRow
from jobrun._core.port import StoreLimits
from jobrun._core.rules.schedules import MAX_CATCH_UP_SLOTS, ON_TIME_S
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import SQL_BACKENDS, done_at_once, drive, hand_made_row

MODULE, JOB = "reports", "tick"
# First sight at 00:00:10; the every-minute slots are 00:01:00, 00:02:00, ...
SEEN = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)


def at(minute: int, second: float = 0) -> datetime:
    return datetime(2026, 1, 1, 0, minute, tzinfo=UTC) + timedelta(seconds=second)


def every_minute(catch_up: str = "latest", **options: Any) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, lambda p: jobrun.PassResult(done=True))
    registry.schedule(MODULE, JOB, "* * * * *", catch_up=catch_up, **options)
    return registry


async def tick(store: Any, registry: jobrun.JobRegistry, now: datetime) -> list[str]:
    """The instances of the runs one call started."""
    return [run.instance for run in await jobrun.start_scheduled_runs(store, registry, now=now)]


async def test_a_new_schedule_starts_with_its_next_slot_once(store: Any):
    registry = every_minute(payload={"kind": "hourly"}, priority=3)
    assert await tick(store, registry, SEEN) == []
    assert await tick(store, registry, at(0, 59.999)) == []
    started = await jobrun.start_scheduled_runs(store, registry, now=at(1, 0.25))
    assert [run.instance for run in started] == ["2026-01-01T00:01:00.000Z"]
    run = started[0]
    assert (run.module_id, run.job, run.payload, run.priority) == (
        MODULE,
        JOB,
        {"kind": "hourly"},
        3,
    )
    assert run.started_at == at(1, 0.25)
    # Again, by the same or by another caller: the slot is taken.
    assert await tick(store, registry, at(1, 0.5)) == []
    assert await tick(store, every_minute(), at(1, 0.5)) == []


async def test_a_slot_whose_run_finished_is_not_started_again(store: Any):
    registry = every_minute()
    await tick(store, registry, SEEN)
    assert len(await tick(store, registry, at(1))) == 1
    clock = FakeClock(at(1, 1))
    assert (await drive(store, registry, clock)).completed == 1
    # No live run holds the key any more: only the slot's record stops a second start.
    assert await tick(store, registry, at(1, 2)) == []
    assert [run.status for run in await jobrun.job_runs(store)] == ["done"]


@pytest.mark.parametrize(
    ("catch_up", "after_downtime"),
    [
        ("all", ["00:02", "00:03", "00:04", "00:05"]),
        ("latest", ["00:05"]),
        ("none", []),
    ],
)
async def test_a_restarted_worker_catches_up_per_policy(
    store: Any, catch_up: str, after_downtime: list[str]
):
    registry = every_minute(catch_up)
    await tick(store, registry, SEEN)
    assert await tick(store, registry, at(1, 0.05)) == ["2026-01-01T00:01:00.000Z"]
    # Down from 00:01:01 to 00:05:40: slots 00:02 to 00:05 were missed.
    started = await tick(store, registry, at(5, 40))
    assert [instance[11:16] for instance in started] == after_downtime
    # From then on, on time again, whatever the policy.
    assert await tick(store, registry, at(6, 0.1)) == ["2026-01-01T00:06:00.000Z"]


async def test_none_still_starts_the_current_slot_when_it_is_on_time(store: Any):
    registry = every_minute("none")
    await tick(store, registry, SEEN)
    # Down through 00:01 to 00:04; back 2 s after 00:05: that slot is due now, not missed.
    assert await tick(store, registry, at(5, 2)) == ["2026-01-01T00:05:00.000Z"]


async def test_catching_up_all_is_bounded(store: Any):
    registry = jobrun.JobRegistry()
    registry.schedule(MODULE, JOB, "* * * * * *", catch_up="all")  # every second
    await tick(store, registry, SEEN)
    # An hour down: 3,600 missed slots, the newest 100 started, oldest first.
    started = await tick(store, registry, SEEN + timedelta(hours=1))
    assert len(started) == MAX_CATCH_UP_SLOTS
    assert started == sorted(started)
    assert started[-1] == "2026-01-01T01:00:10.000Z"
    assert started[0] == "2026-01-01T00:58:31.000Z"


async def test_a_shared_instance_joins_the_live_run_of_the_previous_slot(store: Any):
    registry = every_minute(instance="nightly")
    await tick(store, registry, SEEN)
    first = await jobrun.start_scheduled_runs(store, registry, now=at(1))
    second = await jobrun.start_scheduled_runs(store, registry, now=at(2))
    assert [run.id for run in second] == [first[0].id]
    assert first[0].instance == "nightly"
    assert len(await jobrun.job_runs(store)) == 1
    # Once that run is done, the next slot starts a new one.
    assert (await drive(store, registry, FakeClock(at(2, 1)))).completed == 1
    third = await jobrun.start_scheduled_runs(store, registry, now=at(3))
    assert len(third) == 1
    assert third[0].id != first[0].id


async def test_two_schedules_of_one_job_keep_their_own_slots(store: Any):
    registry = jobrun.JobRegistry()
    registry.schedule(MODULE, JOB, "* * * * *", instance="a")
    registry.schedule(MODULE, JOB, "*/2 * * * *", instance="b")
    await tick(store, registry, SEEN)
    first = await jobrun.start_scheduled_runs(store, registry, now=at(1))
    assert [run.instance for run in first] == ["a"]
    both = await jobrun.start_scheduled_runs(store, registry, now=at(2))
    assert [run.instance for run in both] == ["a", "b"]
    assert both[0].id == first[0].id  # a's slot of 00:02 joined its live run of 00:01
    assert len(await jobrun.job_runs(store)) == 2


@pytest.mark.parametrize("backend", SQL_BACKENDS, indirect=True)
async def test_concurrent_callers_start_each_slot_once(engine: AsyncEngine):
    """Eight callers with their own stores at once, slot after slot: one run per slot."""
    registry = jobrun.JobRegistry()
    registry.schedule(MODULE, JOB, "* * * * * */2", catch_up="all")
    stores = [jobrun.SqlJobRunStore(engine) for _ in range(8)]
    await jobrun.start_scheduled_runs(stores[0], registry, now=SEEN)
    for second in range(12, 30, 2):
        now = datetime(2026, 1, 1, 0, 0, second, 1000, tzinfo=UTC)
        results = await asyncio.gather(
            *(jobrun.start_scheduled_runs(store, registry, now=now) for store in stores)
        )
        assert sorted(len(result) for result in results) == [0] * 7 + [1]
    runs = await jobrun.job_runs(stores[0], limit=500)
    assert sorted(run.instance for run in runs) == [
        f"2026-01-01T00:00:{second:02d}.000Z" for second in range(12, 30, 2)
    ]


def test_bad_schedules_are_refused():
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError, match="cron"):
        registry.schedule(MODULE, JOB, "every minute")
    with pytest.raises(jobrun.JobValidationError, match="cron"):
        registry.schedule(MODULE, JOB, "61 * * * *")
    with pytest.raises(TypeError, match="cron"):
        registry.schedule(MODULE, JOB, 5)  # type: ignore[arg-type]
    with pytest.raises(jobrun.JobValidationError, match="catch_up"):
        registry.schedule(MODULE, JOB, "* * * * *", catch_up="some")
    with pytest.raises(jobrun.JobValidationError, match="instance"):
        registry.schedule(MODULE, JOB, "* * * * *", instance="")
    with pytest.raises(jobrun.JobValidationError, match="payload"):
        registry.schedule(MODULE, JOB, "* * * * *", payload={"x": float("nan")})
    with pytest.raises(TypeError, match="priority"):
        registry.schedule(MODULE, JOB, "* * * * *", priority="high")  # type: ignore[arg-type]
    assert registry.schedules() == []
    registry.schedule(MODULE, JOB, "* * * * *")
    with pytest.raises(jobrun.JobConflictError, match="already has a schedule"):
        registry.schedule(MODULE, JOB, "*/5 * * * *")
    assert len(registry.schedules()) == 1


def test_bad_limits_and_retention_are_refused():
    registry = jobrun.JobRegistry()
    handler = lambda p: jobrun.PassResult(done=True)  # noqa: E731
    with pytest.raises(ValueError, match="max_concurrent"):
        registry.register(MODULE, JOB, handler, max_concurrent=0)
    with pytest.raises(TypeError, match="max_concurrent"):
        registry.register(MODULE, JOB, handler, max_concurrent=True)
    with pytest.raises(TypeError, match="keep_for"):
        registry.register(MODULE, JOB, handler, keep_for=30)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_for"):
        registry.register(MODULE, JOB, handler, keep_for=timedelta(0))
    assert len(registry) == 0


def test_bad_schedules_are_refused_with_what_was_wrong() -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match=r"^cron must be a str, got int$"):
        registry.schedule("m", "j", cast(Any, 5))
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "61 * * * *")
    assert str(refused.value) == (
        "cron '61 * * * *' is not a cron expression croniter reads "
        "(five fields, or six with seconds last)"
    )
    assert refused.value.errors == [{"path": "cron", "message": "not a valid cron expression"}]
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "* * * * *", catch_up="some")
    assert str(refused.value) == "catch_up must be one of latest, all, none, got 'some'"
    assert refused.value.errors == [{"path": "catch_up", "message": "'some' is not a policy"}]
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.schedule("m", "j", "* * * * *", payload={"x": float("nan")})
    assert refused.value.errors[0]["path"].startswith("payload")
    for module_id, job, path in (("", "j", "module_id"), ("m", "", "job")):
        with pytest.raises(jobrun.JobValidationError) as refused:
            registry.schedule(module_id, job, "* * * * *")
        assert [entry["path"] for entry in refused.value.errors] == [path]
    assert registry.schedules() == []


def test_a_schedule_keeps_its_priority_and_its_next_slot_is_strictly_after() -> None:
    registry = jobrun.JobRegistry()
    registry.schedule("m", "j", "*/5 * * * *", priority=7)
    (schedule,) = registry.schedules()
    assert schedule.priority == 7
    ten = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert schedule.next_slot(ten + timedelta(minutes=2)) == ten + timedelta(minutes=5)
    assert schedule.next_slot(ten + timedelta(minutes=5)) == ten + timedelta(minutes=10)


async def test_a_scheduled_payload_over_the_stores_cap_is_refused_as_the_payload() -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "j", done_at_once)
    registry.schedule("m", "j", "* * * * *", payload={"text": "z" * 100})
    store = MemoryJobRunStore(limits=StoreLimits(max_payload_bytes=50))
    clock = FakeClock()
    assert await jobrun.start_scheduled_runs(store, registry, clock=clock) == []  # first sight
    with pytest.raises(jobrun.JobValidationError) as refused:
        await jobrun.start_scheduled_runs(store, registry, now=clock.now() + timedelta(minutes=1))
    assert [error["path"] for error in refused.value.errors] == ["payload"]
    assert await jobrun.job_runs(store) == []


async def test_a_schedule_seen_for_the_first_time_holds_up_no_other() -> None:
    before, after = jobrun.JobRegistry(), jobrun.JobRegistry()
    for registry in (before, after):
        registry.register("m", "old", done_at_once)
        registry.register("m", "new", done_at_once)
    before.schedule("m", "old", "* * * * *")
    after.schedule("m", "new", "* * * * *")  # added ahead of the one already stored
    after.schedule("m", "old", "* * * * *")
    store, clock = MemoryJobRunStore(), FakeClock()
    assert await jobrun.start_scheduled_runs(store, before, clock=clock) == []
    started = await jobrun.start_scheduled_runs(
        store, after, now=clock.now() + timedelta(minutes=1)
    )
    assert [run.job for run in started] == ["old"]


# -- a schedule's row counts its own cron's slots (issue 23, item 6) -------------------------


def scheduled(cron: str, catch_up: str = "all", job: str = JOB) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    registry.register(MODULE, job, done_at_once)
    registry.schedule(MODULE, job, cron, catch_up=catch_up)
    return registry


async def test_a_changed_cron_starts_from_its_next_slot_and_replays_nothing(store: Any):
    daily = scheduled("0 0 * * *")
    await tick(store, daily, SEEN)
    assert await tick(store, daily, SEEN + timedelta(days=1)) == ["2026-01-02T00:00:00.000Z"]
    # Twelve hours later the cron is every minute: 720 minutes since the daily slot,
    # none of them a slot of this cron's while it was stored.
    minutely = scheduled("* * * * *")
    noon = datetime(2026, 1, 2, 12, 0, 30, tzinfo=UTC)
    assert await tick(store, minutely, noon) == []
    assert await tick(store, minutely, noon + timedelta(seconds=1)) == []
    (row,) = await store.schedule_rows()
    assert (row.cron, row.last_slot_at, row.last_run_id) == (
        "* * * * *",
        "2026-01-02T12:00:30.000Z",
        None,  # the reset instant is no run's slot
    )
    assert await tick(store, minutely, noon + timedelta(seconds=30)) == ["2026-01-02T12:01:00.000Z"]
    # Down three minutes: catch_up="all" starts this cron's missed slots, no more.
    later = await tick(store, minutely, noon + timedelta(minutes=3, seconds=40))
    assert [instance[11:16] for instance in later] == ["12:02", "12:03", "12:04"]


async def test_a_host_with_the_old_cron_takes_no_slot_of_the_new_one(store: Any):
    await tick(store, every_minute(), SEEN)
    await tick(store, scheduled("*/5 * * * *"), at(0, 20))  # changed: reset at 00:00:20
    # A caller still on the old cron, which read the row before the reset, finds the
    # slot not its own: the row counts the new cron's slots now.
    old_slot = ScheduleRow(MODULE, JOB, "", "2026-01-01T00:01:00.000Z", None, "x", "* * * * *")
    run = dataclasses.replace(hand_made_row(1, module_id=MODULE, job=JOB), id="0" * 25 + "9")
    assert await store.start_slot(old_slot, run) is None
    assert await jobrun.job_runs(store) == []
    # Its next tick resets the row to its own cron again (two versions of an app fight:
    # see docs/how-to), starting nothing.
    assert await tick(store, every_minute(), at(1)) == []
    assert [row.cron for row in await store.schedule_rows()] == ["* * * * *"]


async def test_of_callers_resetting_one_row_one_wins(store: Any):
    await tick(store, every_minute(), SEEN)
    (row,) = await store.schedule_rows()
    changed = dataclasses.replace(row, cron="*/5 * * * *", last_slot_at="2026-01-01T00:00:20.000Z")
    assert await store.reset_schedule(changed, "* * * * *")
    assert not await store.reset_schedule(dataclasses.replace(changed, cron="0 * * * *"), row.cron)
    assert [found.cron for found in await store.schedule_rows()] == ["*/5 * * * *"]


async def test_a_row_written_before_the_cron_was_stored_starts_from_its_next_slot(store: Any):
    # Revision 0004 wrote no cron: the slots since its last one may be another cron's.
    old = ScheduleRow(MODULE, JOB, "", "2026-01-01T00:00:00.000Z", None, "x", None)
    await store.add_schedules([old])
    registry = every_minute("all")
    assert await tick(store, registry, at(30, 5)) == []
    assert await tick(store, registry, at(31, 1)) == ["2026-01-01T00:31:00.000Z"]


async def test_a_removed_schedule_is_forgotten_and_starts_afresh_when_added_again(store: Any):
    hourly = scheduled("0 * * * *")
    await tick(store, hourly, SEEN)
    assert len(await tick(store, hourly, SEEN + timedelta(hours=1))) == 1
    # The schedule removed (its job still registered): its row goes.
    without = jobrun.JobRegistry()
    without.register(MODULE, JOB, done_at_once)
    assert await tick(store, without, SEEN + timedelta(hours=2)) == []
    assert await store.schedule_rows() == []
    # Added again three days later: no replay of the 72 hours it was away.
    back = SEEN + timedelta(days=3, hours=1, minutes=30)
    assert await tick(store, hourly, back) == []
    assert await tick(store, hourly, back + timedelta(minutes=30)) == ["2026-01-04T02:00:00.000Z"]


async def test_a_registry_forgets_only_schedules_of_jobs_it_registers(store: Any):
    theirs = scheduled("* * * * *", job="theirs")
    ours = jobrun.JobRegistry()
    ours.register(MODULE, JOB, done_at_once)
    ours.schedule(MODULE, JOB, "* * * * *", instance="a")
    ours.schedule(MODULE, JOB, "* * * * *", instance="b")
    await tick(store, theirs, SEEN)
    await tick(store, ours, SEEN)
    # The next version drops schedule "b" and registers nothing of the other app's.
    smaller = jobrun.JobRegistry()
    smaller.register(MODULE, JOB, done_at_once)
    smaller.schedule(MODULE, JOB, "* * * * *", instance="a")
    assert await tick(store, smaller, at(1)) == ["a"]
    assert [(row.job, row.schedule) for row in await store.schedule_rows()] == [
        ("theirs", ""),
        (JOB, "a"),
    ]
    # A registry that schedules a job it does not register forgets nothing either.
    scheduler_only = jobrun.JobRegistry()
    scheduler_only.schedule(MODULE, "elsewhere", "* * * * *")
    await tick(store, scheduler_only, at(1, 30))
    assert len(await store.schedule_rows()) == 3


async def test_each_jobs_retention_is_recorded_and_replaced(store: Any):
    """The record a worker that does not register a job reads its keep_for from."""
    assert await store.recorded_retention() == {}
    at_ = "2026-01-01T00:00:00.000Z"
    await store.record_retention({("m", "a"): 60, ("m", "b"): 3600, ("m", "c"): None}, at_)
    assert await store.recorded_retention() == {("m", "a"): 60, ("m", "b"): 3600}
    await store.record_retention({("m", "a"): None, ("m", "b"): 7200}, at_)
    assert await store.recorded_retention() == {("m", "b"): 7200}
    await store.record_retention({}, at_)
    assert await store.recorded_retention() == {("m", "b"): 7200}


def test_with_catch_up_none_a_slot_exactly_on_time_s_old_is_still_on_time() -> None:
    registry = jobrun.JobRegistry()
    registry.schedule("m", "j", "*/5 * * * *", catch_up="none")
    (schedule,) = registry.schedules()
    slot = datetime(2026, 1, 1, 10, 5, tzinfo=UTC)
    after = slot - timedelta(minutes=1)
    on_time = slot + timedelta(seconds=ON_TIME_S)
    assert schedule.slots_to_start(after, on_time) == [slot]
    assert schedule.slots_to_start(after, on_time + timedelta(milliseconds=1)) == []


def test_a_slot_less_than_a_millisecond_ahead_is_not_yet_due() -> None:
    # A worker's timer may fire a fraction of a millisecond before the slot; the
    # slot must wait for it, or its run starts (and is stamped) before its instant.
    registry = jobrun.JobRegistry()
    registry.schedule("m", "j", "* * * * * */2")  # seconds last, as croniter reads it
    (schedule,) = registry.schedules()
    slot = datetime(2026, 1, 1, 10, 0, 2, tzinfo=UTC)
    after = slot - timedelta(seconds=2)
    for early_us in (1, 500, 999):
        assert schedule.due_slots(after, slot - timedelta(microseconds=early_us)) == []
    assert schedule.due_slots(after, slot) == [slot]
    assert schedule.next_slot(slot - timedelta(microseconds=1)) == slot
