"""Contract tests for ``RetryAfter``: a pass that asks to come back later ends ``deferred``.

Nothing is committed and nothing charged (run attempts, step attempts, takeovers);
the lease is handed back; the ledger keeps the steps that finished; the run is due
again after the delay; deferrals in a row are counted, reset by a commit or a
failure, and past the job's ``max_deferrals`` the run fails. Every test runs on
the memory store, SQLite and Postgres (the ``store`` fixture).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

import jobrun
from jobrun._core.model.records import StepRow
from jobrun.testing import FakeClock, drive_until_idle
from tests.support import JOB, drive, iso, row_of, set_columns, start_id
from tests.support import MODULE_ID as MODULE

IMMEDIATE = jobrun.RetryPolicy(base_delay_ms=0, max_attempts=3)


def registry_of(handler: Any, **options: Any) -> jobrun.JobRegistry:
    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE, **options)
    return registry


async def test_a_step_raising_retry_after_defers_the_pass_and_charges_nothing(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    calls: list[str] = []
    limited = {"open": False}

    def fetch() -> str:
        calls.append("fetch")
        return "page"

    def send() -> str:
        calls.append("send")
        if not limited["open"]:
            raise jobrun.RetryAfter(30, reason="rate limited by the API")
        return "sent"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("seen")
        page = await p.step("fetch", fetch)
        sent = await p.step("send", send)
        return jobrun.PassResult(cursor=[page, sent])

    registry = registry_of(handler)
    run_id = await start_id(store, clock)
    # As if an earlier pass had failed once and another driver's lease had expired.
    await set_columns(store, engine, run_id, attempts=1, lease_takeovers=2)
    before = await row_of(store, run_id)

    report = await drive(store, registry, clock)
    assert (report.attempted, report.deferred, report.retrying, report.failed) == (1, 1, 0, 0)
    assert report.errors == []
    row = await row_of(store, run_id)
    # Nothing committed, nothing charged, the lease handed back.
    assert (row.status, row.cursor, row.counters) == ("running", None, "{}")
    assert (row.attempts, row.lease_takeovers, row.passes_committed) == (1, 2, 0)
    assert (row.lease_owner, row.lease_driver, row.lease_began_at) == (None, None, None)
    assert row.lease_epoch == before.lease_epoch + 1  # the claim's, as for any pass
    assert (row.deferrals, row.deferred_reason) == (1, "rate limited by the API")
    assert row.next_attempt_at == iso(clock.now() + timedelta(seconds=30))
    # The step that finished stays durable; the deferring step left no attempt behind.
    assert await store.steps(run_id) == {"fetch": StepRow("fetch", '"page"', 1, None)}

    # Not due before the delay is over.
    clock.advance(seconds=29)
    assert (await drive(store, registry, clock)).attempted == 0
    clock.advance(seconds=1)
    limited["open"] = True
    again = await drive(store, registry, clock)
    assert (again.attempted, again.advanced) == (1, 1)
    # The replay answered "fetch" from the ledger: its body ran once in all.
    assert calls == ["fetch", "send", "send"]
    row = await row_of(store, run_id)
    assert (row.cursor, row.counters, row.passes_committed) == ('["page","sent"]', '{"seen":1}', 1)
    assert (row.attempts, row.deferrals, row.deferred_reason) == (0, 0, None)


async def test_a_handler_raising_retry_after_directly_defers_its_pass(
    store: Any, clock: FakeClock
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise jobrun.RetryAfter(0.5)

    registry = registry_of(handler)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock, max_passes=3)
    # A deferred pass ends the claim's passes, like a failure.
    assert (report.attempted, report.deferred, report.advanced) == (1, 1, 0)
    row = await row_of(store, run_id)
    assert (row.deferrals, row.deferred_reason, row.attempts) == (1, "", 0)
    assert row.next_attempt_at == iso(clock.now() + timedelta(milliseconds=500))
    record = await jobrun.get_job_run(store, run_id)
    assert record is not None
    assert (record.deferrals, record.lease_driver) == (1, None)


async def test_a_handler_may_catch_retry_after_from_a_step(store: Any, clock: FakeClock) -> None:
    def busy() -> None:
        raise jobrun.RetryAfter(60, reason="busy")

    caught: list[tuple[float, str]] = []

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        try:
            await p.step("busy", busy)
        except jobrun.RetryAfter as deferral:
            p.count("skipped")
            caught.append((deferral.seconds, deferral.reason))
        return jobrun.PassResult(done=True)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_of(handler), clock)
    assert (report.completed, report.deferred) == (1, 0)
    row = await row_of(store, run_id)
    assert (row.status, row.counters, row.deferrals) == ("done", '{"skipped":1}', 0)
    assert caught == [(60.0, "busy")]
    # The handler's business: the body left no attempt in the ledger (now dropped).
    assert await store.steps(run_id) == {}


async def test_deferrals_in_a_row_are_counted_and_a_failure_resets_them(
    store: Any, clock: FakeClock
) -> None:
    plan = ["defer", "defer", "fail", "defer"]

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        what = plan.pop(0)
        if what == "fail":
            raise RuntimeError("boom")
        raise jobrun.RetryAfter(10, reason=f"{len(plan)} left")

    registry = registry_of(handler)
    run_id = await start_id(store, clock)
    seen = []
    for _ in range(4):
        await drive(store, registry, clock)
        row = await row_of(store, run_id)
        seen.append((row.deferrals, row.deferred_reason, row.attempts))
        clock.advance(seconds=10)
    assert seen == [(1, "3 left", 0), (2, "2 left", 0), (0, None, 1), (1, "0 left", 1)]


async def test_past_max_deferrals_the_run_fails_saying_why(store: Any, clock: FakeClock) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise jobrun.RetryAfter(1, reason="still closed")

    registry = registry_of(handler, max_deferrals=2)
    run_id = await start_id(store, clock)
    reports = []
    for _ in range(3):
        reports.append(await drive(store, registry, clock))
        clock.advance(seconds=1)
    assert [(r.deferred, r.failed) for r in reports] == [(1, 0), (1, 0), (0, 1)]
    row = await row_of(store, run_id)
    assert row.status == "failed"
    assert row.last_error is not None
    assert row.last_error.startswith("RetryAfter: the run was deferred 2 times in a row")
    assert "the limit is 2" in row.last_error
    assert row.last_error.endswith("(last reason: still closed)")
    assert reports[-1].errors[0].error == row.last_error
    assert (row.deferrals, row.deferred_reason, row.lease_owner) == (0, None, None)


async def test_a_resumed_run_starts_with_no_deferrals(
    store: Any, engine: AsyncEngine | None, clock: FakeClock
) -> None:
    run_id = await start_id(store, clock)
    await set_columns(store, engine, run_id, deferrals=5, deferred_reason="x", status="failed")
    assert await jobrun.resume_job_run(store, run_id, clock=clock)
    row = await row_of(store, run_id)
    assert (row.status, row.deferrals, row.deferred_reason) == ("running", 0, None)


async def test_max_deferrals_zero_fails_at_the_first_deferral(store: Any, clock: FakeClock) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise jobrun.RetryAfter(1)

    run_id = await start_id(store, clock)
    report = await drive(store, registry_of(handler, max_deferrals=0), clock)
    assert report.failed == 1
    assert (await row_of(store, run_id)).status == "failed"


async def test_observers_hear_a_deferred_pass_and_step_and_the_kit_waits_it_out(
    store: Any, clock: FakeClock
) -> None:
    deferrals = {"left": 2}

    def call_api() -> str:
        if deferrals["left"]:
            deferrals["left"] -= 1
            raise jobrun.RetryAfter(90, reason="429")
        return "ok"

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("prepare", lambda: 1)
        await p.step("call", call_api)
        return jobrun.PassResult(done=True)

    await start_id(store, clock)
    report = await drive_until_idle(store, registry_of(handler), clock=clock)
    assert report.outcomes() == ["deferred", "deferred", "completed"]
    assert report.advanced_s == 180
    assert report.errors == []
    first, second, last = report.passes
    assert [(step.name, step.outcome) for step in first.steps] == [
        ("prepare", "ran"),
        ("call", "deferred"),
    ]
    assert first.end.error == "retry after 90 s: 429"
    assert [step.outcome for step in second.steps] == ["memo", "deferred"]
    assert last.ran() == ["call"]
