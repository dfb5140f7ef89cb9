"""Observation hooks: what the pass engine tells whoever listens, and a default that logs.

Before each pass the driver calls ``observer.pass_started(start)``. The observer
answers with a :class:`PassWatch` for that pass (to hear its steps and its end)
or ``None`` (to hear nothing more of it). When no watch is handed out, a step
costs one ``is None`` check more than it would without observation at all, so
the default observer, which logs, answers ``None`` whenever its logger would
drop the records (the library configures no handlers: quiet by default).

Nothing here does I/O of its own; the logging module is the host's to configure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias

from jobrun._core.model.formats import format_instant
from jobrun._core.model.records import RunKey
from jobrun.errors import LeaseLostError, RetryAfter, StepFailedError, safe_message

PassOutcomeName: TypeAlias = Literal[
    "advanced", "completed", "retrying", "failed", "superseded", "deferred", "interrupted"
]
StepOutcomeName: TypeAlias = Literal["ran", "memo", "failed", "lost", "deferred", "error"]

PASS_LOGGER = "jobrun.pass"
STEP_LOGGER = "jobrun.step"
_log = logging.getLogger("jobrun.observe")


def _observer_failed(what: str) -> None:
    # An observer is the host's code: its bug must not fail a pass or leak a lease.
    _log.warning("a pass observer failed in %s; carrying on", what, exc_info=True)


@dataclass(frozen=True, slots=True)
class PassStart:
    """A pass about to run: its run, who drives it, and what the claim found."""

    run: RunKey
    driver: str
    # 1 for the first pass of this claim, 2 for the next one under the same lease...
    number: int
    # Consecutive failed passes before this one.
    attempts: int
    # The claim took the run over from another driver (its lease had expired or
    # it was proven dead); as the claim returned it, so a later pass is never counted.
    taken_over: bool


@dataclass(frozen=True, slots=True)
class StepEnd:
    """One ``step()`` call, finished: ``ran`` (its body ran and its result was stored),
    ``memo`` (answered from the ledger), ``failed`` (body raised or attempts were
    spent), ``lost`` (the lease was gone), ``deferred`` (the body raised ``RetryAfter``:
    no attempt recorded), ``error`` (refused: reused name, bad argument, or cancelled)."""

    name: str
    outcome: StepOutcomeName
    # The attempt this was (1 for a first run); 0 when no attempt was made.
    attempt: int
    duration_s: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PassEnd:
    """A pass, finished: its outcome as the driver counted it, or ``interrupted``
    when it was cancelled (its lease was handed back)."""

    run: RunKey
    number: int
    outcome: PassOutcomeName
    duration_s: float
    steps_run: int
    memo_hits: int
    steps_failed: int
    error: str | None = None
    next_attempt_at: datetime | None = None
    """When the run is due again after a ``retrying`` or ``deferred`` pass (its
    backoff or ``RetryAfter``); ``None`` for every other outcome."""


class PassWatch(Protocol):
    """What hears one pass. Calls come from the pass's own task (steps a handler
    gathers come from their own tasks), never from another thread."""

    def step_started(self, name: str) -> None:
        """A ``step()`` call began (before the ledger is consulted)."""
        ...

    def step_ended(self, end: StepEnd) -> None:
        """A ``step()`` call ended: ran, answered from the ledger, failed, or refused."""
        ...

    def pass_ended(self, end: PassEnd) -> None:
        """The pass ended; the last call this watch gets."""
        ...


class PassObserver(Protocol):
    """What hears passes: ``pass_started`` returns a watch for the pass, or ``None``.

    Observers must be quick and must not raise: they run on the pass's own task.
    Pass several to ``observe_all``; the driver's default is ``LOG_PASSES``.
    """

    def pass_started(self, start: PassStart) -> PassWatch | None:
        """A pass is about to run; return a watch to hear its steps and end, or ``None``."""
        ...


class PassProbe:
    """The engine's side of one watched pass: times it, counts its steps, calls the watch.

    Created by the driver only when the observer handed out a watch; the step path
    checks for it once and otherwise does nothing.
    """

    __slots__ = (
        "_began",
        "_monotonic",
        "memo_hits",
        "start",
        "steps_failed",
        "steps_run",
        "watch",
    )

    def __init__(self, start: PassStart, watch: PassWatch, monotonic: Callable[[], float]) -> None:
        self.start = start
        self.watch = watch
        self.steps_run = 0
        self.memo_hits = 0
        self.steps_failed = 0
        # The pass's clock: durations under a test clock are virtual seconds.
        self._monotonic = monotonic
        self._began = monotonic()

    async def around_step(
        self, name: str, run_step: Callable[[], Any], memo: Callable[[], int | None]
    ) -> Any:
        """Run ``run_step()`` (the step itself), telling the watch when it starts and ends.

        ``memo()`` says, after the step returned, whether the ledger answered it
        (``None``) or which attempt ran its body.
        """
        watch = self.watch
        try:
            watch.step_started(name)
        except Exception:
            _observer_failed("step_started")
        began = self._monotonic()
        try:
            value = await run_step()
        except BaseException as error:
            elapsed = self._monotonic() - began
            if isinstance(error, StepFailedError):
                self.steps_failed += 1
                end = StepEnd(name, "failed", error.attempts, elapsed, str(error))
            elif isinstance(error, LeaseLostError):
                end = StepEnd(name, "lost", 0, elapsed, str(error))
            elif isinstance(error, RetryAfter):
                end = StepEnd(name, "deferred", 0, elapsed, str(error))
            else:
                text = f"{type(error).__name__}: {safe_message(error)}"
                end = StepEnd(name, "error", 0, elapsed, text)
            self._step_ended(end)
            raise
        elapsed = self._monotonic() - began
        attempt = memo()
        if attempt is None:
            self.memo_hits += 1
            self._step_ended(StepEnd(name, "memo", 0, elapsed))
        else:
            self.steps_run += 1
            self._step_ended(StepEnd(name, "ran", attempt, elapsed))
        return value

    def _step_ended(self, end: StepEnd) -> None:
        try:
            self.watch.step_ended(end)
        except Exception:
            _observer_failed("step_ended")

    def end(
        self,
        outcome: PassOutcomeName,
        error: str | None = None,
        next_attempt_at: datetime | None = None,
    ) -> None:
        end = PassEnd(
            run=self.start.run,
            number=self.start.number,
            outcome=outcome,
            duration_s=self._monotonic() - self._began,
            steps_run=self.steps_run,
            memo_hits=self.memo_hits,
            steps_failed=self.steps_failed,
            error=error,
            next_attempt_at=next_attempt_at,
        )
        try:
            self.watch.pass_ended(end)
        except Exception:
            _observer_failed("pass_ended")


def start_watch(
    observer: PassObserver, start: PassStart, monotonic: Callable[[], float]
) -> PassProbe | None:
    """Ask ``observer`` about a pass; a probe for it (timed on ``monotonic``) if it
    wants to watch, else ``None``."""
    try:
        watch = observer.pass_started(start)
    except Exception:
        _observer_failed("pass_started")
        return None
    return None if watch is None else PassProbe(start, watch, monotonic)


# --- composing ------------------------------------------------------------------------------


class _AllWatches:
    __slots__ = ("_watches",)

    def __init__(self, watches: list[PassWatch]) -> None:
        self._watches = watches

    def step_started(self, name: str) -> None:
        for watch in self._watches:
            watch.step_started(name)

    def step_ended(self, end: StepEnd) -> None:
        for watch in self._watches:
            watch.step_ended(end)

    def pass_ended(self, end: PassEnd) -> None:
        # Ended in reverse, so observers that nest (tracing contexts) unwind in order.
        for watch in reversed(self._watches):
            watch.pass_ended(end)


class _AllObservers:
    __slots__ = ("_observers",)

    def __init__(self, observers: tuple[PassObserver, ...]) -> None:
        self._observers = observers

    def pass_started(self, start: PassStart) -> PassWatch | None:
        watches = [
            watch
            for watch in (observer.pass_started(start) for observer in self._observers)
            if watch is not None
        ]
        if not watches:
            return None
        return watches[0] if len(watches) == 1 else _AllWatches(watches)


def observe_all(*observers: PassObserver) -> PassObserver:
    """One observer that tells each of ``observers``; with none, an observer that hears nothing.

    ``observe_all()`` turns observation off; ``observe_all(LOG_PASSES, mine)`` keeps
    the default log lines beside one's own observer.
    """
    return _AllObservers(tuple(observers))


# --- the default: log lines -----------------------------------------------------------------


def _short(text: str | None, limit: int = 200) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class _LoggedPass:
    __slots__ = ("_observer", "_start", "_steps")

    def __init__(self, observer: LoggingObserver, start: PassStart, steps: bool) -> None:
        self._observer = observer
        self._start = start
        self._steps = steps

    def _fields(self) -> dict[str, Any]:
        run = self._start.run
        return {
            "run_id": run.id,
            "module_id": run.module_id,
            "job": run.job,
            "instance": run.instance,
            "pass_number": self._start.number,
            "driver": self._start.driver,
        }

    def step_started(self, name: str) -> None:
        if self._steps:
            self._observer.step_logger.debug(
                "step %r started (run %s)",
                name,
                self._start.run.id,
                extra=self._fields() | {"step": name},
            )

    def step_ended(self, end: StepEnd) -> None:
        if not self._steps:
            return
        fields = self._fields() | {
            "step": end.name,
            "outcome": end.outcome,
            "attempt": end.attempt,
            "duration_ms": round(end.duration_s * 1000, 3),
            "error": end.error,
        }
        self._observer.step_logger.debug(
            "step %r %s in %.1f ms (run %s)%s",
            end.name,
            end.outcome,
            end.duration_s * 1000,
            self._start.run.id,
            f": {_short(end.error)}" if end.error else "",
            extra=fields,
        )

    def pass_ended(self, end: PassEnd) -> None:
        run = end.run
        fields = self._fields() | {
            "outcome": end.outcome,
            "duration_ms": round(end.duration_s * 1000, 3),
            "steps_run": end.steps_run,
            "memo_hits": end.memo_hits,
            "steps_failed": end.steps_failed,
            "error": end.error,
            "next_attempt_at": end.next_attempt_at,
        }
        # "retrying at <when>": the time the run is due again, apart from how long
        # the pass itself took (a "retrying in 0.9 ms" read as the delay).
        again = "" if end.next_attempt_at is None else f" at {_instant(end.next_attempt_at)}"
        self._observer.pass_logger.info(
            "pass %s/%s[%s] %s%s (pass took %.1f ms): %s, %s (run %s)%s",
            run.module_id,
            run.job,
            run.instance,
            end.outcome,
            again,
            end.duration_s * 1000,
            _plural(end.steps_run, "step") + " run",
            _plural(end.memo_hits, "memo hit"),
            run.id,
            f": {_short(end.error)}" if end.error else "",
            extra=fields,
        )


class LoggingObserver:
    """One INFO line per pass on ``jobrun.pass``; a DEBUG line per step on ``jobrun.step``.

    Every record carries its fields as attributes (``extra``): ``run_id``,
    ``module_id``, ``job``, ``instance``, ``pass_number``, ``driver``, and on a pass's
    end ``outcome``, ``duration_ms``, ``steps_run``, ``memo_hits``, ``steps_failed``,
    ``error``, ``next_attempt_at`` (a retrying or deferred run's due instant); step records
    add ``step`` and ``attempt``. When neither logger is
    enabled for its level, passes are not watched at all.
    """

    def __init__(
        self,
        pass_logger: logging.Logger | None = None,
        step_logger: logging.Logger | None = None,
    ) -> None:
        self.pass_logger = pass_logger or logging.getLogger(PASS_LOGGER)
        self.step_logger = step_logger or logging.getLogger(STEP_LOGGER)

    def pass_started(self, start: PassStart) -> PassWatch | None:
        """A watch that logs this pass, or ``None`` when both loggers are off."""
        # isEnabledFor is cached by the logging module: cheap to ask per pass.
        passes = self.pass_logger.isEnabledFor(logging.INFO)
        steps = self.step_logger.isEnabledFor(logging.DEBUG)
        if not (passes or steps):
            return None
        if self.pass_logger.isEnabledFor(logging.DEBUG):
            run = start.run
            self.pass_logger.debug(
                "pass %s/%s[%s] started (run %s, pass %d%s)",
                run.module_id,
                run.job,
                run.instance,
                run.id,
                start.number,
                ", taken over" if start.taken_over else "",
                extra={
                    "run_id": run.id,
                    "module_id": run.module_id,
                    "job": run.job,
                    "instance": run.instance,
                    "pass_number": start.number,
                    "driver": start.driver,
                    "attempts": start.attempts,
                    "taken_over": start.taken_over,
                },
            )
        return _LoggedPass(self, start, steps)


LOG_PASSES: PassObserver = LoggingObserver()
"""The default observer of :func:`jobrun.run_due_jobs`: log lines, nothing else."""


def _instant(at: datetime) -> str:
    """A log line's instant: the stored text without its date's separator noise."""
    return format_instant(at).replace("T", " ")
