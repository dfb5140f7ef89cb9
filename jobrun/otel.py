"""OpenTelemetry tracing for passes and steps (the ``otel`` extra: ``pip install jobrun[otel]``).

``TracingObserver`` makes one span per pass (``jobrun.pass``) and one child span
per step (``jobrun.step``). The pass span is the current span while the handler
runs, and a step's span while its body runs, so spans the handler makes nest
under them. Attributes carry the run's key::

    import jobrun
    from jobrun.otel import TracingObserver

    observer = jobrun.observe_all(jobrun.LOG_PASSES, TracingObserver())
    await jobrun.run_due_jobs(store, registry, observer=observer)

Only ``opentelemetry-api`` is needed here; the host sets up the SDK and exporters.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from jobrun._core import PassEnd, PassStart, PassWatch, StepEnd
from jobrun._version import __version__

PASS_SPAN = "jobrun.pass"
STEP_SPAN = "jobrun.step"
_FAILED_PASSES = frozenset({"retrying", "failed", "interrupted"})


def _version() -> str:
    return __version__


class _TracedPass:
    __slots__ = ("_context", "_key", "_span", "_steps", "_token", "_tracer")

    def __init__(self, tracer: trace.Tracer, span: trace.Span, key: dict[str, str]) -> None:
        self._tracer = tracer
        self._span = span
        self._key = key
        self._context = trace.set_span_in_context(span)
        # The pass span is current while the handler runs (same task, so detached in order).
        self._token = otel_context.attach(self._context)
        self._steps: dict[str, list[tuple[trace.Span, Any]]] = {}

    def step_started(self, name: str) -> None:
        span = self._tracer.start_span(
            STEP_SPAN,
            context=self._context,
            attributes={"jobrun.step.name": name, **self._key},
        )
        token = otel_context.attach(trace.set_span_in_context(span, self._context))
        self._steps.setdefault(name, []).append((span, token))

    def step_ended(self, end: StepEnd) -> None:
        started = self._steps.get(end.name)
        if not started:
            return
        span, token = started.pop()
        if not started:
            del self._steps[end.name]
        span.set_attribute("jobrun.step.outcome", end.outcome)
        span.set_attribute("jobrun.step.memo", end.outcome == "memo")
        if end.attempt:
            span.set_attribute("jobrun.step.attempt", end.attempt)
        if end.error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, end.error))
        span.end()
        otel_context.detach(token)

    def pass_ended(self, end: PassEnd) -> None:
        span = self._span
        span.set_attribute("jobrun.pass.outcome", end.outcome)
        span.set_attribute("jobrun.pass.steps_run", end.steps_run)
        span.set_attribute("jobrun.pass.memo_hits", end.memo_hits)
        span.set_attribute("jobrun.pass.steps_failed", end.steps_failed)
        if end.outcome in _FAILED_PASSES:
            span.set_status(trace.Status(trace.StatusCode.ERROR, end.error or end.outcome))
        span.end()
        otel_context.detach(self._token)


class TracingObserver:
    """A pass observer that traces: a ``jobrun.pass`` span per pass, a ``jobrun.step`` child
    span per step.

    Pass attributes: ``jobrun.run_id``, ``jobrun.module_id``, ``jobrun.job``,
    ``jobrun.instance``, ``jobrun.pass.number``, ``jobrun.pass.attempts``,
    ``jobrun.pass.taken_over``, ``jobrun.driver``, and at the end
    ``jobrun.pass.outcome``, ``jobrun.pass.steps_run``, ``jobrun.pass.memo_hits``,
    ``jobrun.pass.steps_failed``. A retrying, failed or interrupted pass has status
    ERROR. Step attributes: ``jobrun.step.name``, ``jobrun.step.outcome``,
    ``jobrun.step.memo``, ``jobrun.step.attempt`` and the run's key.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("jobrun", _version(), tracer_provider=tracer_provider)

    def pass_started(self, start: PassStart) -> PassWatch | None:
        """Open the pass's span; the returned watch opens and ends the step spans."""
        run = start.run
        key = {
            "jobrun.run_id": run.id,
            "jobrun.module_id": run.module_id,
            "jobrun.job": run.job,
            "jobrun.instance": run.instance,
        }
        span = self._tracer.start_span(
            PASS_SPAN,
            attributes={
                **key,
                "jobrun.pass.number": start.number,
                "jobrun.pass.attempts": start.attempts,
                "jobrun.pass.taken_over": start.taken_over,
                "jobrun.driver": start.driver,
            },
        )
        if not span.is_recording():
            # Sampled out: no step spans, no work per step.
            span.end()
            return None
        return _TracedPass(self._tracer, span, key)
