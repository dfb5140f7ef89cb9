"""Prometheus metrics for a worker (the ``prometheus`` extra: ``pip install jobrun[prometheus]``).

``WorkerMetrics`` is both a pass observer (passes by outcome, step and pass
durations, lease takeovers) and a health callback (due runs, oldest due age,
running, leased and failed runs, per database), so a worker wires it in twice::

    metrics = WorkerMetrics()
    metrics.serve(9464)  # http://127.0.0.1:9464/metrics
    await jobrun.run_worker(
        urls, registry,
        observer=jobrun.observe_all(jobrun.LOG_PASSES, metrics),
        on_health=metrics.record_health,
    )

``jobrun worker --metrics-port N`` does exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _start_http_server

from jobrun._core import JobRunHealth, PassEnd, PassStart, PassWatch, StepEnd

# Steps span a memo hit (microseconds) to a long API call (minutes).
STEP_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0, 30.0, 120.0, 600.0)
PASS_BUCKETS = (0.01, 0.05, 0.25, 1.0, 2.5, 10.0, 30.0, 120.0, 600.0, 1800.0)


class _MeteredPass:
    __slots__ = ("_job", "_metrics")

    def __init__(self, metrics: WorkerMetrics, job: tuple[str, str]) -> None:
        self._metrics = metrics
        self._job = job

    def step_started(self, name: str) -> None:
        pass

    def step_ended(self, end: StepEnd) -> None:
        self._metrics.step_seconds.labels(*self._job, end.outcome).observe(end.duration_s)

    def pass_ended(self, end: PassEnd) -> None:
        self._metrics.passes.labels(*self._job, end.outcome).inc()
        self._metrics.pass_seconds.labels(*self._job, end.outcome).observe(end.duration_s)


class WorkerMetrics:
    """The worker's metrics, registered on ``registry`` (the default one unless given).

    * ``jobrun_passes_total{module_id, job, outcome}``: passes by outcome
      (advanced, completed, retrying, failed, superseded, deferred, paused, interrupted);
    * ``jobrun_pass_duration_seconds{module_id, job, outcome}``: histogram;
    * ``jobrun_step_duration_seconds{module_id, job, outcome}``: histogram, outcome
      ran, memo, failed, lost, deferred or error;
    * ``jobrun_lease_takeovers_total{module_id, job}``: passes that began by taking
      a run over from another holder (stranded or orphaned);
    * ``jobrun_due_runs{database}``, ``jobrun_oldest_due_age_seconds{database}``,
      ``jobrun_running_runs{database}``, ``jobrun_leased_runs{database}``,
      ``jobrun_orphaned_runs{database}``, ``jobrun_failed_runs{database}`` (cancelled
      runs included), ``jobrun_cancelled_runs{database}`` (the failed runs an
      operator cancelled), ``jobrun_paused_runs{database}`` (the running runs an
      operator paused, with the run or its job): gauges from
      :func:`jobrun.job_run_health` (the words as it defines them), refreshed every
      worker interval.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        job = ("module_id", "job")
        self.passes = Counter(
            "jobrun_passes", "Passes run, by outcome.", (*job, "outcome"), registry=self.registry
        )
        self.pass_seconds = self._durations(
            "jobrun_pass_duration_seconds", "How long passes took, by outcome.", PASS_BUCKETS
        )
        self.step_seconds = self._durations(
            "jobrun_step_duration_seconds",
            "How long step() calls took, by outcome (memo: answered from the ledger).",
            STEP_BUCKETS,
        )
        self.takeovers = Counter(
            "jobrun_lease_takeovers",
            "Passes that began by taking a run over from another holder (stranded or orphaned).",
            job,
            registry=self.registry,
        )
        self._health_gauges()

    def _health_gauges(self) -> None:
        """The gauges a worker sets from :func:`jobrun.job_run_health`, by database."""
        self.due = self._gauge(
            "jobrun_due_runs", "Running runs whose due instant has passed (stranded ones included)."
        )
        self.oldest_due_age = self._gauge(
            "jobrun_oldest_due_age_seconds",
            "How long the longest-waiting due run has waited (0 when none).",
        )
        self.running = self._gauge("jobrun_running_runs", "Live (running) runs.")
        self.leased = self._gauge(
            "jobrun_leased_runs",
            "Running runs held by a lease that has not expired (orphaned ones included).",
        )
        self.orphaned = self._gauge(
            "jobrun_orphaned_runs",
            "Leased runs whose holder is provably dead (taken over at the next claim).",
        )
        self.failed = self._gauge(
            "jobrun_failed_runs", "Runs that ended failed (cancelled ones included)."
        )
        self.cancelled = self._gauge("jobrun_cancelled_runs", "Failed runs an operator cancelled.")
        self.paused = self._gauge(
            "jobrun_paused_runs", "Running runs an operator paused (never claimed until unpaused)."
        )

    def _durations(self, name: str, text: str, buckets: Sequence[float]) -> Histogram:
        """A histogram of ``name`` with help ``text``, by job and outcome."""
        labels = ("module_id", "job", "outcome")
        return Histogram(name, text, labels, buckets=buckets, registry=self.registry)

    def _gauge(self, name: str, text: str) -> Gauge:
        """A gauge of ``name`` with help ``text``, one value per database."""
        return Gauge(name, text, ("database",), registry=self.registry)

    def pass_started(self, start: PassStart) -> PassWatch | None:
        """Count a takeover; the returned watch counts the pass and times it and its steps."""
        job = (start.run.module_id, start.run.job)
        if start.taken_over:
            self.takeovers.labels(*job).inc()
        return _MeteredPass(self, job)

    def record_health(self, database: str, health: JobRunHealth) -> None:
        """Set the health gauges of ``database`` (the worker's ``on_health`` callback)."""
        self.due.labels(database).set(health.due)
        self.oldest_due_age.labels(database).set(health.oldest_due_age_s)
        self.running.labels(database).set(health.running)
        self.leased.labels(database).set(health.leased)
        self.orphaned.labels(database).set(health.orphaned)
        self.failed.labels(database).set(health.failed)
        self.cancelled.labels(database).set(health.cancelled)
        self.paused.labels(database).set(health.paused)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``address:port`` from a daemon thread."""
        _start_http_server(port, addr=address, registry=self.registry)
