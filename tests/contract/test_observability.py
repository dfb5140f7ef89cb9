"""Observation: the structured log lines, the observer protocol, OpenTelemetry spans and
Prometheus metrics.

Most tests use the memory store (the hooks live in the core); the takeover test runs on
every backend because it depends on what each store leaves on a taken-over run.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import jobrun
from jobrun._core.engine import observe
from jobrun._core.engine.observe import PassEnd, PassStart
from jobrun._core.model.formats import add_milliseconds, format_instant
from jobrun._core.model.records import ClaimRequest, RunKey, StepRow
from jobrun.otel import TracingObserver
from jobrun.prometheus import WorkerMetrics
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import PassEnds

NO_WAIT = jobrun.RetryPolicy(max_attempts=3, base_delay_ms=0)


class Recorder:
    """An observer that writes down every call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def pass_started(self, start: jobrun.PassStart) -> jobrun.PassWatch | None:
        self.events.append(("pass_started", start))
        return self

    def step_started(self, name: str) -> None:
        self.events.append(("step_started", name))

    def step_ended(self, end: jobrun.StepEnd) -> None:
        self.events.append(("step_ended", end))

    def pass_ended(self, end: jobrun.PassEnd) -> None:
        self.events.append(("pass_ended", end))

    def of(self, kind: str) -> list[Any]:
        return [payload for name, payload in self.events if name == kind]


def flaky_registry() -> jobrun.JobRegistry:
    """``m/j``: pass 1 runs ``a`` then fails in ``b``; pass 2 replays ``a`` (memo) and
    completes ``b``."""
    registry = jobrun.JobRegistry()
    calls = {"b": 0}

    def b() -> str:
        calls["b"] += 1
        if calls["b"] == 1:
            raise RuntimeError("upstream hiccup")
        return "fine"

    @registry.job("m", "j", retry=NO_WAIT)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: 1)
        await p.step("b", b)
        return jobrun.PassResult(done=True)

    return registry


async def two_passes(observer: jobrun.PassObserver | None = None) -> tuple[str, list[Any]]:
    store = MemoryJobRunStore()
    registry = flaky_registry()
    run = await jobrun.start_job_run(store, module_id="m", job="j", instance="i-1")
    reports = []
    for _ in range(2):
        reports.append(await jobrun.run_due_jobs(store, registry, observer=observer))
    return run.id, reports


async def test_a_retrying_pass_tells_when_the_run_is_due_again() -> None:
    store = MemoryJobRunStore()
    registry = jobrun.JobRegistry()

    @registry.job("m", "slow-retry", retry=jobrun.RetryPolicy(max_attempts=3, base_delay_ms=60_000))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise RuntimeError("upstream hiccup")

    run = await jobrun.start_job_run(store, module_id="m", job="slow-retry")
    recorder = Recorder()
    await jobrun.run_due_jobs(store, registry, observer=recorder)
    (end,) = recorder.of("pass_ended")
    stored = await jobrun.get_job_run(store, run.id)
    assert stored is not None
    assert stored.next_attempt_at is not None
    assert end.outcome == "retrying"
    assert end.next_attempt_at == stored.next_attempt_at  # the backoff, not the pass's time
    assert end.next_attempt_at - stored.updated_at >= timedelta(seconds=30)


# --- logging --------------------------------------------------------------------------------


async def test_each_pass_logs_one_info_line_with_its_fields(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="jobrun")
    run_id, _ = await two_passes()
    records = [record for record in caplog.records if record.name == "jobrun.pass"]
    assert [record.levelno for record in records] == [logging.INFO, logging.INFO]
    first, second = records
    for record in records:
        assert record.run_id == run_id  # type: ignore[attr-defined]
        assert (record.module_id, record.job, record.instance) == ("m", "j", "i-1")  # type: ignore[attr-defined]
        assert record.duration_ms >= 0  # type: ignore[attr-defined]
    assert (first.outcome, first.steps_run, first.memo_hits, first.steps_failed) == (  # type: ignore[attr-defined]
        "retrying",
        1,
        0,
        1,
    )
    assert "upstream hiccup" in first.error  # type: ignore[attr-defined]
    assert (second.outcome, second.steps_run, second.memo_hits) == ("completed", 1, 1)  # type: ignore[attr-defined]
    # A retrying pass says when the run is due again, apart from how long it took.
    retried = first.getMessage()
    assert first.next_attempt_at is not None  # type: ignore[attr-defined]
    assert retried.startswith("pass m/j[i-1] retrying at 20"), retried
    assert " (pass took " in retried
    message = second.getMessage()
    assert second.next_attempt_at is None  # type: ignore[attr-defined]
    assert message.startswith("pass m/j[i-1] completed (pass took "), message
    assert "1 step run, 1 memo hit" in message
    assert run_id in message
    # INFO only: no per-step lines.
    assert not [record for record in caplog.records if record.name == "jobrun.step"]


async def test_debug_adds_a_line_per_step(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG, logger="jobrun")
    await two_passes()
    ended = [
        (record.step, record.outcome)  # type: ignore[attr-defined]
        for record in caplog.records
        if record.name == "jobrun.step" and hasattr(record, "outcome")
    ]
    assert ended == [("a", "ran"), ("b", "failed"), ("a", "memo"), ("b", "ran")]
    started = [r for r in caplog.records if r.name == "jobrun.pass" and r.levelno == logging.DEBUG]
    assert len(started) == 2


def test_the_library_configures_no_handlers():
    assert logging.getLogger("jobrun").handlers == []
    assert logging.getLogger("jobrun.pass").handlers == []
    assert logging.getLogger("jobrun").level == logging.NOTSET


async def test_nothing_is_watched_when_the_loggers_are_off(monkeypatch: pytest.MonkeyPatch):
    quiet = logging.getLogger("jobrun.test-quiet")
    monkeypatch.setattr(quiet, "level", logging.WARNING)
    observer = jobrun.LoggingObserver(quiet, quiet)
    probes: list[object] = []
    real = observe.PassProbe.__init__

    def counting(self: observe.PassProbe, *args: Any) -> None:
        probes.append(self)
        real(self, *args)

    monkeypatch.setattr(observe.PassProbe, "__init__", counting)
    _, reports = await two_passes(observer)
    assert reports[1].completed == 1
    assert probes == [], "a pass nobody listens to gets no probe, so its steps do no extra work"


# --- the observer protocol ------------------------------------------------------------------


async def test_an_observer_hears_passes_and_steps_in_order():
    recorder = Recorder()
    run_id, _ = await two_passes(recorder)
    kinds = [kind for kind, _ in recorder.events]
    assert (
        kinds
        == [
            "pass_started",
            "step_started",
            "step_ended",
            "step_started",
            "step_ended",
            "pass_ended",
        ]
        * 2
    )
    starts = recorder.of("pass_started")
    assert [(s.run.id, s.number, s.attempts, s.taken_over) for s in starts] == [
        (run_id, 1, 0, False),
        (run_id, 1, 1, False),
    ]
    steps = recorder.of("step_ended")
    assert [(s.name, s.outcome, s.attempt) for s in steps] == [
        ("a", "ran", 1),
        ("b", "failed", 1),
        ("a", "memo", 0),
        ("b", "ran", 2),
    ]
    assert "upstream hiccup" in steps[1].error
    ends = recorder.of("pass_ended")
    assert [(e.outcome, e.steps_run, e.memo_hits, e.steps_failed) for e in ends] == [
        ("retrying", 1, 0, 1),
        ("completed", 1, 1, 0),
    ]


async def test_passes_under_one_lease_are_numbered():
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        page = p.cursor or 0
        return jobrun.PassResult(cursor=page + 1, done=page == 2)

    store = MemoryJobRunStore()
    await jobrun.start_job_run(store, module_id="m", job="j")
    recorder = Recorder()
    await jobrun.run_due_jobs(store, registry, max_passes=5, observer=recorder)
    assert [s.number for s in recorder.of("pass_started")] == [1, 2, 3]
    assert [e.outcome for e in recorder.of("pass_ended")] == ["advanced", "advanced", "completed"]


async def test_observe_all_tells_each_and_observe_none_tells_nobody():
    first, second = Recorder(), Recorder()
    await two_passes(jobrun.observe_all(first, second))
    assert first.events == second.events
    assert len(first.events) == 12
    silent = jobrun.observe_all()
    start = first.of("pass_started")[0]
    assert silent.pass_started(start) is None


async def test_a_failing_observer_does_not_fail_the_pass(caplog: pytest.LogCaptureFixture):
    class Broken(Recorder):
        def step_ended(self, end: jobrun.StepEnd) -> None:
            raise RuntimeError("observer bug")

        def pass_ended(self, end: jobrun.PassEnd) -> None:
            raise RuntimeError("observer bug")

    class BrokenAtStart:
        def pass_started(self, start: jobrun.PassStart) -> jobrun.PassWatch | None:
            raise RuntimeError("observer bug")

    caplog.set_level(logging.WARNING, logger="jobrun")
    for observer in (Broken(), BrokenAtStart()):
        _, reports = await two_passes(observer)  # type: ignore[arg-type]
        assert (reports[0].retrying, reports[1].completed) == (1, 1)
    assert any("observer failed" in r.getMessage() for r in caplog.records)


async def test_a_cancelled_pass_ends_interrupted():
    registry = jobrun.JobRegistry()
    entered = asyncio.Event()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> None:
        async def forever() -> None:
            entered.set()
            # sleep: a step that never ends on its own: the test cancels it
            await asyncio.sleep(3600)

        await p.step("wait", forever)

    store = MemoryJobRunStore()
    run = await jobrun.start_job_run(store, module_id="m", job="j")
    recorder = Recorder()
    task = asyncio.create_task(jobrun.run_due_jobs(store, registry, observer=recorder))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(e.name, e.outcome) for e in recorder.of("step_ended")] == [("wait", "error")]
    assert [e.outcome for e in recorder.of("pass_ended")] == ["interrupted"]
    assert store.runs[run.id].lease_owner is None, "the lease was handed back"


async def test_a_takeover_is_reported(store: Any, clock: FakeClock):
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    now_at = format_instant(clock())
    # A driver claims the run and dies without a word.
    zombie = ClaimRequest(now_at, "ZOMBIE", "zombie:1", {("m", "j"): add_milliseconds(now_at, 500)})
    assert await store.claim(zombie) is not None
    clock.advance(seconds=1)

    registry = jobrun.JobRegistry()

    @registry.job("m", "j", lease_ms=500, retry=NO_WAIT)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if p.cursor is None:
            raise RuntimeError("first pass after the takeover fails")
        return jobrun.PassResult(done=True)

    metrics = WorkerMetrics(CollectorRegistry())
    recorder = Recorder()
    observer = jobrun.observe_all(recorder, metrics)
    await jobrun.run_due_jobs(store, registry, clock=clock, observer=observer)
    # The next claim finds the run unleased: not a takeover.
    await jobrun.run_due_jobs(store, registry, clock=clock, observer=observer)
    assert [s.taken_over for s in recorder.of("pass_started")] == [True, False]
    assert [s.run.id for s in recorder.of("pass_started")] == [run.id, run.id]
    taken = metrics.registry.get_sample_value(
        "jobrun_lease_takeovers_total", {"module_id": "m", "job": "j"}
    )
    assert taken == 1


async def test_a_takeover_is_counted_once_and_a_later_pass_of_the_run_not_at_all(
    store: Any, clock: FakeClock
):
    """The run keeps its takeover count and note after the taken-over pass loses its
    lease (here to an operator's release); its next pass starts from a fresh claim and
    is no takeover, though the row still reads as one."""
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    now_at = format_instant(clock())
    zombie = ClaimRequest(now_at, "ZOMBIE", "zombie:1", {("m", "j"): add_milliseconds(now_at, 500)})
    assert await store.claim(zombie) is not None
    clock.advance(seconds=1)
    registry = jobrun.JobRegistry()
    passes: list[int] = []

    @registry.job("m", "j", lease_ms=500, retry=NO_WAIT)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        passes.append(len(passes) + 1)
        if len(passes) == 1:
            assert await jobrun.release_job_lease(store, p.run.id)
            await p.step("refused", lambda: None)
        return jobrun.PassResult(done=True)

    metrics = WorkerMetrics(CollectorRegistry())
    recorder = Recorder()
    observer = jobrun.observe_all(recorder, metrics)
    first = await jobrun.run_due_jobs(store, registry, clock=clock, observer=observer)
    assert first.superseded == 1
    released = await jobrun.get_job_run(store, run.id)
    assert released is not None
    assert released.lease_takeovers == 1
    assert released.last_error is not None
    assert "taken over" in released.last_error
    second = await jobrun.run_due_jobs(store, registry, clock=clock, observer=observer)
    assert second.completed == 1
    assert [s.taken_over for s in recorder.of("pass_started")] == [True, False]
    taken = metrics.registry.get_sample_value(
        "jobrun_lease_takeovers_total", {"module_id": "m", "job": "j"}
    )
    assert taken == 1


# --- OpenTelemetry --------------------------------------------------------------------------


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_a_pass_is_a_span_and_each_step_a_child_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
):
    provider, exporter = spans
    user_tracer = provider.get_tracer("host")
    registry = jobrun.JobRegistry()

    def fetch() -> int:
        with user_tracer.start_as_current_span("host.fetch"):
            return 7

    passes = 0

    @registry.job("shop", "reindex", retry=NO_WAIT)
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        nonlocal passes
        passes += 1
        await p.step("fetch", fetch)
        if passes == 1:
            await p.step("explode", lambda: 1 / 0)
        return jobrun.PassResult(done=True)

    store = MemoryJobRunStore()
    run = await jobrun.start_job_run(store, module_id="shop", job="reindex", instance="s-42")
    observer = TracingObserver(tracer_provider=provider)
    await jobrun.run_due_jobs(store, registry, observer=observer)
    await jobrun.run_due_jobs(store, registry, observer=observer)

    finished: list[ReadableSpan] = list(exporter.get_finished_spans())
    passes = [span for span in finished if span.name == "jobrun.pass"]
    steps = [span for span in finished if span.name == "jobrun.step"]
    assert len(passes) == 2
    assert len(steps) == 3
    key = {
        "jobrun.run_id": run.id,
        "jobrun.module_id": "shop",
        "jobrun.job": "reindex",
        "jobrun.instance": "s-42",
    }
    first, second = sorted(passes, key=lambda span: span.start_time or 0)
    for span in passes:
        assert span.attributes is not None
        assert {name: span.attributes[name] for name in key} == key
        assert span.parent is None
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes["jobrun.pass.outcome"] == "retrying"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert second.attributes["jobrun.pass.outcome"] == "completed"
    assert second.attributes["jobrun.pass.memo_hits"] == 1
    assert second.status.status_code == trace.StatusCode.UNSET

    def children(parent: ReadableSpan) -> list[tuple[Any, ...]]:
        assert parent.context is not None
        found = []
        for span in sorted(steps, key=lambda span: span.start_time or 0):
            assert span.parent is not None
            assert span.context is not None
            if span.parent.span_id == parent.context.span_id:
                assert span.context.trace_id == parent.context.trace_id
                assert span.attributes is not None
                assert span.attributes["jobrun.run_id"] == run.id
                found.append(
                    (
                        span.attributes["jobrun.step.name"],
                        span.attributes["jobrun.step.outcome"],
                        span.status.status_code,
                    )
                )
        return found

    assert children(first) == [
        ("fetch", "ran", trace.StatusCode.UNSET),
        ("explode", "failed", trace.StatusCode.ERROR),
    ]
    assert children(second) == [("fetch", "memo", trace.StatusCode.UNSET)]
    # The host's own span, made inside the step body, is the step's child.
    (host_span,) = [span for span in finished if span.name == "host.fetch"]
    (fetch_span,) = [
        span
        for span in steps
        if span.attributes is not None and span.attributes["jobrun.step.outcome"] == "ran"
    ]
    assert host_span.parent is not None
    assert fetch_span.context is not None
    assert host_span.parent.span_id == fetch_span.context.span_id
    # Nothing is left attached once the passes are over.
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_a_sampled_out_pass_is_not_watched():
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    observer = TracingObserver(tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    start = jobrun.PassStart(
        jobrun.RunKey("01", "m", "j", "i"), driver="d", number=1, attempts=0, taken_over=False
    )
    assert observer.pass_started(start) is None


# --- Prometheus -----------------------------------------------------------------------------


async def test_prometheus_counts_passes_steps_and_health():
    metrics = WorkerMetrics(CollectorRegistry())
    store = MemoryJobRunStore()
    await two_passes_on(store, metrics)
    value = metrics.registry.get_sample_value
    job = {"module_id": "m", "job": "j"}
    assert value("jobrun_passes_total", job | {"outcome": "retrying"}) == 1
    assert value("jobrun_passes_total", job | {"outcome": "completed"}) == 1
    assert value("jobrun_step_duration_seconds_count", job | {"outcome": "ran"}) == 2
    assert value("jobrun_step_duration_seconds_count", job | {"outcome": "memo"}) == 1
    assert value("jobrun_step_duration_seconds_count", job | {"outcome": "failed"}) == 1
    assert value("jobrun_pass_duration_seconds_count", job | {"outcome": "completed"}) == 1

    clock = FakeClock()
    await jobrun.start_job_run(store, module_id="m", job="j", instance="waiting", clock=clock)
    clock.advance(seconds=90)
    metrics.record_health("db-1", await jobrun.job_run_health(store, clock=clock))
    assert value("jobrun_due_runs", {"database": "db-1"}) == 1
    assert value("jobrun_oldest_due_age_seconds", {"database": "db-1"}) == 90
    assert value("jobrun_running_runs", {"database": "db-1"}) == 1
    assert value("jobrun_cancelled_runs", {"database": "db-1"}) == 0
    waiting = (await jobrun.job_runs(store, instance="waiting"))[0]
    await jobrun.cancel_job_run(store, waiting.id, "not wanted", clock=clock)
    metrics.record_health("db-1", await jobrun.job_run_health(store, clock=clock))
    assert value("jobrun_failed_runs", {"database": "db-1"}) == 1
    assert value("jobrun_cancelled_runs", {"database": "db-1"}) == 1
    text = generate_latest(metrics.registry).decode()
    assert 'jobrun_passes_total{job="j",module_id="m",outcome="completed"} 1.0' in text
    assert 'jobrun_cancelled_runs{database="db-1"} 1.0' in text


async def two_passes_on(store: MemoryJobRunStore, observer: jobrun.PassObserver) -> None:
    registry = flaky_registry()
    await jobrun.start_job_run(store, module_id="m", job="j", instance="i-1")
    for _ in range(2):
        await jobrun.run_due_jobs(store, registry, observer=observer)


async def test_debug_lines_name_the_run_the_pass_and_each_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    store, registry = MemoryJobRunStore(), jobrun.JobRegistry()

    @registry.job("m", "j", retry=jobrun.RetryPolicy(max_attempts=1, base_delay_ms=0))
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("a", lambda: 1)
        await p.step("b", _refuse)
        return jobrun.PassResult(done=True)

    run = await jobrun.start_job_run(store, module_id="m", job="j", instance="i-1")
    await jobrun.run_due_jobs(store, registry, driver_name="d-1")
    lines = [(r.name, r.levelno, r.getMessage(), r.__dict__) for r in caplog.records]
    start = [line for line in lines if line[0] == "jobrun.pass" and line[1] == logging.DEBUG]
    assert [message for _, _, message, _ in start] == [
        f"pass m/j[i-1] started (run {run.id}, pass 1)"
    ]
    fields = start[0][3]
    assert (fields["run_id"], fields["module_id"], fields["job"], fields["instance"]) == (
        run.id,
        "m",
        "j",
        "i-1",
    )
    assert (fields["pass_number"], fields["driver"], fields["taken_over"]) == (1, "d-1", False)
    steps = [
        fields for name, _, _, fields in lines if name == "jobrun.step" and "outcome" in fields
    ]
    assert [(f["step"], f["outcome"], f["attempt"], f["error"]) for f in steps] == [
        ("a", "ran", 1, None),
        ("b", "failed", 1, "step 'b' failed: RuntimeError: no"),
    ]
    assert all(f["instance"] == "i-1" and f["driver"] == "d-1" for f in steps)
    ended = [
        message for name, _, message, _ in lines if name == "jobrun.step" and " in " in message
    ]
    assert ended[1].startswith("step 'b' failed in ")
    assert ended[1].endswith(f" ms (run {run.id}): step 'b' failed: RuntimeError: no")
    started = [m for name, _, m, f in lines if name == "jobrun.step" and "outcome" not in f]
    assert started == [f"step 'a' started (run {run.id})", f"step 'b' started (run {run.id})"]


def _refuse() -> None:
    raise RuntimeError("no")


class _BrokenEverywhere:
    """An observer whose every hook raises."""

    def __init__(self) -> None:
        self.passes = 0

    def pass_started(self, start: PassStart) -> _BrokenEverywhere:
        self.passes += 1
        if self.passes == 2:
            raise RuntimeError("observer bug")
        return self

    def step_started(self, name: str) -> None:
        raise RuntimeError("observer bug")

    def step_ended(self, end: jobrun.StepEnd) -> None:
        raise RuntimeError("observer bug")

    def pass_ended(self, end: PassEnd) -> None:
        raise RuntimeError("observer bug")


async def test_a_failing_observer_is_logged_by_hook_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="jobrun")
    store, registry = MemoryJobRunStore(), jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step(f"s{p.cursor}", lambda: 1)
        return jobrun.PassResult(cursor=1, done=p.cursor == 1)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    observer = _BrokenEverywhere()
    for _ in range(2):
        await jobrun.run_due_jobs(store, registry, observer=cast(Any, observer))
    warnings = [r for r in caplog.records if "observer failed" in r.getMessage()]
    assert [r.getMessage() for r in warnings] == [
        f"a pass observer failed in {hook}; carrying on"
        for hook in ("step_started", "step_ended", "pass_ended", "pass_started")
    ]
    assert all(r.exc_info is not None and r.exc_info[0] is RuntimeError for r in warnings)


def test_a_pass_line_gives_its_duration_to_the_microsecond(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 0, False))
    assert watch is not None
    watch.pass_ended(PassEnd(run, 1, "completed", 0.0012345, 0, 0, 0))
    (record,) = [r for r in caplog.records if r.name == "jobrun.pass"]
    assert record.duration_ms == 1.234 or record.duration_ms == 1.235  # type: ignore[attr-defined]


def test_a_step_line_gives_its_duration_and_a_long_error_is_cut_to_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 0, False))
    assert watch is not None
    long_error = "x" * 300 + "\nsecond line"
    watch.step_ended(jobrun.StepEnd("s", "failed", 2, 0.0012345, long_error))
    (record,) = [r for r in caplog.records if r.name == "jobrun.step"]
    assert record.duration_ms == 1.234 or record.duration_ms == 1.235  # type: ignore[attr-defined]
    assert record.getMessage().endswith(" ms (run r-1): " + "x" * 197 + "...")
    assert record.error == long_error  # type: ignore[attr-defined]  # the field keeps it whole


def test_a_taken_over_pass_says_so_and_an_error_of_200_characters_is_kept_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="jobrun")
    run = RunKey(id="r-1", module_id="m", job="j", instance="i")
    watch = jobrun.LoggingObserver().pass_started(PassStart(run, "d", 1, 2, True))
    assert watch is not None
    watch.step_ended(jobrun.StepEnd("s", "failed", 1, 0.5, "y" * 200))
    start, step = (r.getMessage() for r in caplog.records)
    assert start == "pass m/j[i] started (run r-1, pass 1, taken over)"
    assert step.endswith(" ms (run r-1): " + "y" * 200)


async def test_a_pass_counts_every_step_it_ran() -> None:
    store, registry, observer = MemoryJobRunStore(), jobrun.JobRegistry(), PassEnds()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name in ("a", "b", "c"):
            await p.step(name, lambda: 1)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    await jobrun.run_due_jobs(store, registry, observer=observer)
    assert [(end.steps_run, end.memo_hits, end.steps_failed) for end in observer.ends] == [
        (3, 0, 0)
    ]


class _StepEnds(PassEnds):
    """An observer that keeps every step's end too."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[jobrun.StepEnd] = []

    def step_ended(self, end: object) -> None:
        self.steps.append(cast(jobrun.StepEnd, end))


class _FencedStore(MemoryJobRunStore):
    """A store on which the pass's token no longer holds when a step is recorded."""

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        return False


@pytest.mark.parametrize("fenced", [False, True], ids=["reused name", "lease gone"])
async def test_a_step_refused_or_cut_off_by_a_lost_lease_is_told_as_such(fenced: bool) -> None:
    store = _FencedStore() if fenced else MemoryJobRunStore()
    registry, observer = jobrun.JobRegistry(), _StepEnds()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if not fenced:
            await p.step("a", lambda: 1)
        await p.step("a", lambda: 2)
        return jobrun.PassResult(done=True)

    await jobrun.start_job_run(store, module_id="m", job="j", instance="i")
    await jobrun.run_due_jobs(store, registry, observer=observer)
    last = observer.steps[-1]
    assert (last.name, last.outcome, last.attempt) == ("a", "lost" if fenced else "error", 0)
    assert isinstance(last.duration_s, float)
    assert last.duration_s >= 0
    run = (await jobrun.job_runs(store))[0]
    if fenced:
        assert last.error == f"run {run.id} is no longer held by this pass; it stops here"
    else:
        assert str(last.error).startswith("StepReusedError: step 'a' was already called")
