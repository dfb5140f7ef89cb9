"""The driver, ``run_due_jobs``: which runs it picks, how many passes it gives, what it reports.

Every test here runs on the memory store, SQLite and Postgres (the ``store`` fixture).
Rows that the public API cannot produce (hundreds of unregistered runs, malformed
JSON) are written by hand: through the engine on SQL backends, into ``store.runs``
on the memory store.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest

import jobrun
from jobrun.testing import FakeClock
from tests.support import (
    PassEnds,
    RecordingStore,
    claim_as,
    fixed_random,
    hand_made_row,
    put_rows,
    set_columns,
)
from tests.support import start as start_run

NO_WAIT = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=0)


# --- helpers -----------------------------------------------------------------------------


# The store writes a drive may make; a drive with nothing to do makes none.
WRITES = ("start_or_join", "patch", "commit_pass", "record_step")


def claimed(spy: RecordingStore) -> list[str | None]:
    """The run each claim returned, in order (None: nothing was due)."""
    return [None if claim is None else claim.row.id for claim in spy.results["claim"]]


def finishing_registry(module_id: str = "mine", job: str = "walk") -> tuple[Any, list[str]]:
    """A registry whose one job completes in a single pass, logging the run ids it sees."""
    registry = jobrun.JobRegistry()
    seen: list[str] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.run.id)
        return jobrun.PassResult(cursor="end", done=True)

    registry.register(module_id, job, handler)
    return registry, seen


# Runs of this file's job unless a test names another.
start = functools.partial(start_run, module_id="mine", job="walk")


# --- limit counts runnable runs ---------------------------------------------------------


async def test_limit_counts_runnable_runs_and_leaves_unregistered_rows_untouched(
    store, engine, clock
):
    registry, seen = finishing_registry()
    # Oldest first: unregistered, registered, unregistered, unregistered, registered, registered.
    await put_rows(store, engine, [hand_made_row(1)])
    first = await start(store, clock, instance="a")
    # Rows inserted after a start need ids that sort after it: reuse the minted order.
    second_foreign = await start(store, clock, instance="x", module_id="elsewhere", job="theirs")
    third_foreign = await start(store, clock, instance="y", module_id="elsewhere", job="theirs")
    second = await start(store, clock, instance="b")
    third = await start(store, clock, instance="c")
    foreign_ids = [hand_made_row(1).id, second_foreign.id, third_foreign.id]
    foreign_before = [await store.get(run_id) for run_id in foreign_ids]

    report = await jobrun.run_due_jobs(store, registry, limit=2, clock=clock)

    assert report.attempted == 2
    assert report.completed == 2
    assert report.errors == []
    assert seen == [first.id, second.id]
    assert [await store.get(run_id) for run_id in foreign_ids] == foreign_before
    left = await jobrun.get_job_run(store, third.id)
    assert left is not None
    assert (left.status, left.cursor, left.attempts) == ("running", None, 0)

    # The leftover is still due on the next call; the foreign rows still are not counted.
    report = await jobrun.run_due_jobs(store, registry, limit=2, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert seen[-1] == third.id
    assert [await store.get(run_id) for run_id in foreign_ids] == foreign_before


async def test_unregistered_runs_alone_make_an_empty_report(store, engine, clock):
    registry, seen = finishing_registry()
    await put_rows(store, engine, [hand_made_row(i) for i in range(3)])
    before = [await store.get(hand_made_row(i).id) for i in range(3)]

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert report == jobrun.JobDriveReport()
    assert seen == []
    assert [await store.get(hand_made_row(i).id) for i in range(3)] == before


# --- claims: only registered jobs, however many others wait ---------------------------------


@pytest.mark.parametrize("unregistered", [0, 499, 600])
async def test_unregistered_runs_never_hide_a_registered_one(store, engine, clock, unregistered):
    """The claim asks the database for registered jobs only, so no scan cap applies:
    a run behind any number of other deployments' runs is reached with limit 1."""
    registry, seen = finishing_registry()
    await put_rows(store, engine, [hand_made_row(i) for i in range(unregistered)])
    run = await start(store, clock)
    spy = RecordingStore(store)

    report = await jobrun.run_due_jobs(spy, registry, limit=1, clock=clock)

    assert report.attempted == 1
    assert seen == [run.id]
    assert claimed(spy) == [run.id], "limit 1: one claim, and it is the registered run"
    assert spy.only(*WRITES) == ["commit_pass"]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "done"
    assert record.lease_driver is None, "the outcome clears the lease"


async def test_the_drive_claims_until_nothing_is_due(store, engine, clock):
    registry, seen = finishing_registry()
    await put_rows(store, engine, [hand_made_row(i) for i in range(4)])
    run = await start(store, clock)
    spy = RecordingStore(store)

    report = await jobrun.run_due_jobs(spy, registry, limit=3, clock=clock)

    assert report.attempted == 1
    assert seen == [run.id]
    assert claimed(spy) == [run.id, None]


async def test_one_drive_never_claims_a_run_twice(store, clock):
    """A run that is due again right after its pass waits for the next call."""
    registry, cursors = counting_registry(finish_at=100)
    run = await start(store, clock)
    spy = RecordingStore(store)

    report = await jobrun.run_due_jobs(spy, registry, limit=50, max_passes=2, clock=clock)

    assert (report.attempted, report.advanced) == (1, 2)
    assert claimed(spy) == [run.id, None]
    assert cursors == [None, 1]


# --- order and due-ness --------------------------------------------------------------------


async def test_oldest_run_first(store, clock):
    registry, seen = finishing_registry()
    runs = [await start(store, clock, instance=name) for name in ("one", "two", "three")]
    assert sorted(run.id for run in runs) == [run.id for run in runs]

    report = await jobrun.run_due_jobs(store, registry, limit=2, clock=clock)

    assert report.attempted == 2
    assert seen == [runs[0].id, runs[1].id]
    await jobrun.run_due_jobs(store, registry, clock=clock)
    assert seen == [run.id for run in runs]


async def test_run_in_backoff_is_due_exactly_when_the_clock_reaches_it(store, clock):
    registry = jobrun.JobRegistry()
    calls: list[int] = []

    def flaky(p: jobrun.JobPass) -> jobrun.PassResult:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return jobrun.PassResult(done=True)

    registry.register("mine", "walk", flaky, retry=jobrun.RetryPolicy(base_delay_ms=1000))
    run = await start(store, clock)

    first = await jobrun.run_due_jobs(store, registry, clock=clock, random=fixed_random)
    assert (first.attempted, first.retrying) == (1, 1)
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.next_attempt_at == clock() + timedelta(milliseconds=1000)

    assert await jobrun.run_due_jobs(store, registry, clock=clock) == jobrun.JobDriveReport()
    clock.advance(milliseconds=999)
    assert await jobrun.run_due_jobs(store, registry, clock=clock) == jobrun.JobDriveReport()
    assert len(calls) == 1

    clock.advance(milliseconds=1)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    assert len(calls) == 2


# --- passes per run ------------------------------------------------------------------------


def counting_registry(finish_at: int) -> tuple[Any, list[Any]]:
    """Each pass sees the cursor, hands cursor + 1 forward, and is done at ``finish_at``."""
    registry = jobrun.JobRegistry()
    cursors: list[Any] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        cursors.append(p.cursor)
        following = (p.cursor or 0) + 1
        return jobrun.PassResult(cursor=following, done=following >= finish_at)

    registry.register("mine", "walk", handler)
    return registry, cursors


async def test_max_passes_gives_several_passes_in_one_call(store, clock):
    registry, cursors = counting_registry(finish_at=10)
    run = await start(store, clock)

    report = await jobrun.run_due_jobs(store, registry, max_passes=3, clock=clock)

    assert (report.attempted, report.advanced, report.completed) == (1, 3, 0)
    assert cursors == [None, 1, 2]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.status, record.cursor) == ("running", 3)


async def test_options_object_drives_like_its_keywords_and_keywords_replace_its_fields(
    store, clock
):
    registry, cursors = counting_registry(finish_at=10)
    await start(store, clock)
    options = jobrun.DriveOptions(max_passes=2, clock=clock)

    first = await jobrun.run_due_jobs(store, registry, options=options)
    second = await jobrun.run_due_jobs(store, registry, options=options, max_passes=3)

    assert (first.advanced, second.advanced) == (2, 3)
    assert cursors == [None, 1, 2, 3, 4]
    assert options.max_passes == 2


async def test_max_passes_stops_when_the_run_is_done(store, clock):
    registry, cursors = counting_registry(finish_at=2)
    run = await start(store, clock)

    report = await jobrun.run_due_jobs(store, registry, max_passes=5, clock=clock)

    assert (report.attempted, report.advanced, report.completed) == (1, 1, 1)
    assert cursors == [None, 1]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.status, record.cursor) == ("done", 2)


async def test_max_passes_stops_at_a_failed_pass(store, clock):
    registry = jobrun.JobRegistry()
    calls: list[Any] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        calls.append(p.cursor)
        if p.cursor == 1:
            raise RuntimeError("page 2 broke")
        return jobrun.PassResult(cursor=1)

    registry.register("mine", "walk", handler, retry=NO_WAIT)
    await start(store, clock)

    report = await jobrun.run_due_jobs(store, registry, max_passes=5, clock=clock)

    assert (report.attempted, report.advanced, report.retrying) == (1, 1, 1)
    assert calls == [None, 1]


@pytest.mark.parametrize("max_passes", [0, -5])
async def test_max_passes_below_one_behaves_as_one(store, clock, max_passes):
    registry, cursors = counting_registry(finish_at=10)
    await start(store, clock)

    report = await jobrun.run_due_jobs(store, registry, max_passes=max_passes, clock=clock)

    assert (report.attempted, report.advanced) == (1, 1)
    assert cursors == [None]


async def test_kept_cursor_between_passes_is_the_one_the_store_holds(store, clock):
    registry = jobrun.JobRegistry()
    cursors: list[Any] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult | None:
        cursors.append(p.cursor)
        if len(cursors) == 1:
            return jobrun.PassResult(cursor={"page": 2})
        return jobrun.PassResult()  # change nothing: keep the committed cursor

    registry.register("mine", "walk", handler)
    run = await start(store, clock)

    report = await jobrun.run_due_jobs(store, registry, max_passes=3, clock=clock)

    assert report.advanced == 3
    assert cursors == [None, {"page": 2}, {"page": 2}]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.cursor == {"page": 2}


async def test_an_operator_cancel_between_passes_supersedes_the_next_one(store, clock):
    """The lease carries over between passes; a cancel clears it, so the next
    pass's fenced writes are refused and it is counted as superseded."""
    registry, cursors = counting_registry(finish_at=100)
    run = await start(store, clock)
    spy = RecordingStore(store)

    async def operator_cancels(run_id: str, *_: Any) -> None:
        if len(cursors) == 1:
            await jobrun.cancel_job_run(store, run_id, "stop it", clock=clock)

    spy.after["commit_pass"] = operator_cancels
    report = await jobrun.run_due_jobs(spy, registry, max_passes=5, clock=clock)

    assert (report.attempted, report.advanced, report.superseded, report.failed) == (1, 1, 1, 0)
    assert cursors == [None, 1]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.status, record.cursor) == ("failed", 1)
    assert record.last_error == "cancelled: stop it"


async def test_a_run_failed_behind_the_drivers_back_takes_no_further_write(store, engine, clock):
    registry, _cursors = counting_registry(finish_at=100)
    run = await start(store, clock)
    spy = RecordingStore(store)

    async def somebody_fails_it(run_id: str, *_: Any) -> None:
        await set_columns(store, engine, run_id, status="failed")

    spy.after["commit_pass"] = somebody_fails_it
    report = await jobrun.run_due_jobs(spy, registry, max_passes=5, clock=clock)

    assert (report.attempted, report.advanced, report.superseded) == (1, 1, 1)
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.status, record.cursor) == ("failed", 1)


# --- the report ----------------------------------------------------------------------------


async def test_report_counts_every_outcome_and_names_failing_runs(store, clock):
    registry = jobrun.JobRegistry()

    def advance(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(cursor=1)

    def complete(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    def retry(p: jobrun.JobPass) -> None:
        raise ConnectionError("upstream down")

    def fail(p: jobrun.JobPass) -> None:
        raise KeyError("customer")

    registry.register("m", "advance", advance)
    registry.register("m", "complete", complete)
    registry.register("m", "retry", retry, retry=NO_WAIT)
    registry.register("m", "fail", fail, retry=jobrun.RetryPolicy(max_attempts=1))
    runs = {
        name: await jobrun.start_job_run(store, module_id="m", job=name, clock=clock)
        for name in ("advance", "retry", "complete", "fail")
    }

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert (report.attempted, report.advanced, report.completed) == (4, 1, 1)
    assert (report.retrying, report.failed) == (1, 1)
    assert [(error.run_id, error.error) for error in report.errors] == [
        (runs["retry"].id, "ConnectionError: upstream down"),
        (runs["fail"].id, "KeyError: 'customer'"),
    ]
    retried = await jobrun.get_job_run(store, runs["retry"].id)
    failed = await jobrun.get_job_run(store, runs["fail"].id)
    assert retried is not None
    assert failed is not None
    assert (retried.status, retried.attempts, retried.last_error) == (
        "running",
        1,
        "ConnectionError: upstream down",
    )
    assert (failed.status, failed.attempts, failed.last_error) == (
        "failed",
        1,
        "KeyError: 'customer'",
    )
    assert failed.ended_at == clock()


async def test_one_failing_run_does_not_stop_the_others(store, clock):
    registry = jobrun.JobRegistry()
    seen: list[str] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.run.instance)
        if p.run.instance == "bad":
            raise ValueError("broken input")
        return jobrun.PassResult(done=True)

    registry.register("mine", "walk", handler, retry=NO_WAIT)
    for name in ("first", "bad", "last"):
        await start(store, clock, instance=name)

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert seen == ["first", "bad", "last"]
    assert (report.attempted, report.completed, report.retrying) == (3, 2, 1)
    statuses = {run.instance: run.status for run in await jobrun.job_runs(store)}
    assert statuses == {"first": "done", "bad": "running", "last": "done"}


# --- argument checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit", [0, -1, 1.5, 2.0, True, False, "5", None], ids=lambda value: repr(value)
)
async def test_limit_must_be_a_positive_int(store, clock, limit):
    registry, seen = finishing_registry()
    await start(store, clock)

    with pytest.raises((TypeError, jobrun.JobValidationError), match="limit"):
        await jobrun.run_due_jobs(store, registry, limit=limit, clock=clock)

    assert seen == []
    [run] = await jobrun.job_runs(store)
    assert (run.status, run.attempts, run.cursor) == ("running", 0, None)


@pytest.mark.parametrize("max_passes", [True, 2.0, "2", None], ids=lambda value: repr(value))
async def test_max_passes_must_be_an_int(store, clock, max_passes):
    registry, seen = finishing_registry()
    await start(store, clock)

    with pytest.raises(jobrun.JobValidationError, match="max_passes") as caught:
        await jobrun.run_due_jobs(store, registry, max_passes=max_passes, clock=clock)

    assert caught.value.errors[0]["path"] == "max_passes"
    assert seen == []


async def test_limit_zero_is_a_validation_error_with_its_code(store):
    with pytest.raises(jobrun.JobValidationError) as caught:
        await jobrun.run_due_jobs(store, jobrun.JobRegistry(), limit=0)
    assert caught.value.code == "validation_failed"
    assert "limit" in str(caught.value)


# --- nothing due -------------------------------------------------------------------------


async def test_a_drive_with_nothing_due_writes_nothing(store, engine, clock):
    registry = jobrun.JobRegistry()

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if p.run.instance == "waiting":
            raise RuntimeError("later")
        return jobrun.PassResult(done=True)

    registry.register("mine", "walk", handler, retry=jobrun.RetryPolicy(base_delay_ms=60_000))
    await start(store, clock, instance="finished")
    await start(store, clock, instance="waiting")
    await jobrun.run_due_jobs(store, registry, clock=clock)
    await put_rows(store, engine, [hand_made_row(1)])  # a due run of a job not registered here
    before = await jobrun.job_runs(store)
    assert {run.status for run in before} == {"done", "running"}

    spy = RecordingStore(store)
    report = await jobrun.run_due_jobs(spy, registry, max_passes=3, clock=clock)

    assert report == jobrun.JobDriveReport()
    assert spy.only(*WRITES) == []
    assert await jobrun.job_runs(store) == before


async def test_an_empty_store_makes_an_empty_report(store, clock):
    registry, _ = finishing_registry()
    spy = RecordingStore(store)
    assert await jobrun.run_due_jobs(spy, registry, clock=clock) == jobrun.JobDriveReport()
    assert spy.only(*WRITES) == []
    assert claimed(spy) == [None]


# --- malformed rows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "text"),
    [
        ("payload", "not json at all"),
        ("cursor", "{unclosed"),
        ("counters", "nope"),
        ("counters", "[1, 2]"),
        ("counters", '{"seen": NaN}'),
        ("counters", '{"seen": "many"}'),
        ("payload", '{"x": Infinity}'),
    ],
    ids=[
        "payload-garbage",
        "cursor-garbage",
        "counters-garbage",
        "counters-not-object",
        "counters-nan",
        "counters-not-number",
        "payload-infinity",
    ],
)
async def test_a_malformed_row_fails_its_pass_and_the_drive_carries_on(
    store, engine, clock, column, text
):
    registry = jobrun.JobRegistry()
    seen: list[str] = []

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        seen.append(p.run.instance)
        return jobrun.PassResult(done=True)

    registry.register("mine", "walk", handler, retry=NO_WAIT)
    bad = await start(store, clock, instance="bad")
    good = await start(store, clock, instance="good")
    await set_columns(store, engine, bad.id, **{column: text})
    before = await store.get(bad.id)

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    # Malformed counters can only come from a write that bypassed p.count(): they
    # fail the run at once (resume repairs them); payload and cursor are retried.
    at_once = column == "counters"
    assert seen == ["good"]
    assert (report.attempted, report.completed) == (2, 1)
    assert (report.retrying, report.failed) == ((0, 1) if at_once else (1, 0))
    [error] = report.errors
    assert error.run_id == bad.id
    assert "JSON" in error.error
    assert column in error.error
    after = await store.get(bad.id)
    assert after is not None
    assert after.status == ("failed" if at_once else "running")
    assert after.attempts == 1
    assert after.last_error == error.error
    # A failed pass writes the stored cursor and counters back as they were.
    assert (after.payload, after.cursor, after.counters) == (
        before.payload,
        before.cursor,
        before.counters,
    )
    done = await jobrun.get_job_run(store, good.id)
    assert done is not None
    assert done.status == "done"


async def test_a_malformed_row_fails_for_good_once_attempts_are_spent(store, engine, clock):
    registry = jobrun.JobRegistry()
    registry.register("mine", "walk", lambda p: None, retry=jobrun.RetryPolicy(max_attempts=2))
    run = await start(store, clock)
    await set_columns(store, engine, run.id, cursor="nope")

    for _ in range(3):
        await jobrun.run_due_jobs(store, registry, clock=clock, random=fixed_random)
        clock.advance(seconds=5)

    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert (record.status, record.attempts) == ("failed", 2)
    assert record.last_error is not None
    assert "JSON" in record.last_error
    assert "cursor" in record.last_error
    assert record.decode_error is not None
    assert "cursor" in record.decode_error


async def test_a_row_with_an_unknown_status_is_never_driven(store, engine, clock):
    registry, seen = finishing_registry()
    odd = await start(store, clock, instance="odd")
    await set_columns(store, engine, odd.id, status="paused")
    normal = await start(store, clock, instance="normal")
    before = await store.get(odd.id)

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert report.attempted == 1
    assert seen == [normal.id]
    assert await store.get(odd.id) == before


async def test_timestamps_in_another_iso_form_do_not_stop_a_pass(store, engine, clock):
    registry, seen = finishing_registry()
    run = await start(store, clock)
    await set_columns(
        store,
        engine,
        run.id,
        started_at="2025-12-31T23:00:00+00:00",
        updated_at="2025-12-31 23:00:00",
    )

    report = await jobrun.run_due_jobs(store, registry, clock=clock)

    assert (report.attempted, report.completed) == (1, 1)
    assert seen == [run.id]
    row = await store.get(run.id)
    assert row is not None
    assert row.updated_at == "2026-01-01T00:00:00.000Z"
    assert row.ended_at == "2026-01-01T00:00:00.000Z"


async def test_a_report_counts_each_failed_run(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(max_attempts=1))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise RuntimeError(p.run.instance)

    for instance in ("a", "b"):
        await jobrun.start_job_run(store, module_id="m", job="j", instance=instance, clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.failed) == (2, 2)
    assert sorted(error.error for error in report.errors) == ["RuntimeError: a", "RuntimeError: b"]


async def test_each_job_is_leased_for_its_own_lease_time(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()
    expiries: dict[str, Any] = {}

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        record = await jobrun.get_job_run(store, p.run.id)
        assert record is not None
        expiries[p.run.job] = record.lease_expires_at
        return jobrun.PassResult(done=True)

    registry.register("m", "short", handler, lease_ms=1_000)
    registry.register("m", "long", handler, lease_ms=90_000)
    for job in ("short", "long"):
        await jobrun.start_job_run(store, module_id="m", job=job, clock=clock)
    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).completed == 2
    assert expiries == {
        "short": clock() + timedelta(seconds=1),
        "long": clock() + timedelta(seconds=90),
    }


async def test_only_the_first_pass_after_a_takeover_is_told_it_took_over(
    store: Any, clock: FakeClock
) -> None:
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    assert await claim_as(store, clock, "GONE", lease_ms=1000)
    clock.advance(seconds=2)
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(cursor=(p.cursor or 0) + 1)

    observer = PassEnds()
    report = await jobrun.run_due_jobs(
        store, registry, clock=clock, observer=observer, max_passes=3
    )
    assert report.advanced == 3
    assert [(start.number, start.taken_over) for start in observer.starts] == [
        (1, True),
        (2, False),
        (3, False),
    ]
