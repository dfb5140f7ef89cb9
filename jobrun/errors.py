"""Every error jobrun raises on purpose.

One root, :class:`JobRunError`, with a machine-readable ``code``::

    JobRunError                     code
    ├── JobValidationError          validation_failed   (also a ValueError)
    │   ├── ArgumentTypeError       validation_failed   (an argument of the wrong type:
    │   │                                                also a TypeError)
    │   └── HandlerMistakeError     handler_mistake     (a mistake in handler code: the
    │                                                    run fails at once, no retry)
    ├── JobConflictError            conflict            (``reason`` says which)
    │   └── StepReusedError         conflict            reason == "job_step_reused"
    ├── StepFailedError             step_failed         (a step's attempt failed)
    │   └── StepTimeoutError        step_timeout        (its body overran ``timeout_s``)
    ├── PassTimeoutError            pass_timeout        (a pass overran its budget)
    ├── LeaseLostError              lease_lost          (another driver or an operator
    │                                                    took the run; the pass stops)
    ├── RetryAfter                  deferred            (raised BY a handler or step:
    │                                                    not now, try again in N s)
    ├── JobRunNotFoundError         not_found           (no run has that id)
    ├── SchemaOutdatedError         schema_outdated     (run the migrations first)
    ├── CodeOutdatedError           code_outdated       (the database is newer than
    │                                                    this jobrun may run against)
    └── StoreError                  store_failed        (the database said no)

``StoreError`` is raised only at the store boundary, where driver and database
exceptions are translated; the original exception is kept as ``__cause__``.
Bad input, whatever the argument, is refused before anything is written with a
``JobValidationError`` whose ``errors`` name the argument (``path``) and what is
wrong with it. An argument of the wrong *type* (a list where a name belongs) is
an ``ArgumentTypeError``: a ``JobValidationError`` that is also a ``TypeError``,
as Python users expect, so ``except TypeError`` still catches it. Every refusal
is made in one place (``jobrun._core.model.refusals``), save :class:`RetryAfter`'s own:
this module is the bottom layer and cannot import the core.

:class:`RetryAfter` is the one error meant to be raised by user code rather than
by jobrun: it ends the pass as ``deferred`` (see its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "ArgumentTypeError",
    "CodeOutdatedError",
    "HandlerMistakeError",
    "JobConflictError",
    "JobRunError",
    "JobRunNotFoundError",
    "JobValidationError",
    "LeaseLostError",
    "PassTimeoutError",
    "RetryAfter",
    "SchemaOutdatedError",
    "StepFailedError",
    "StepReusedError",
    "StepTimeoutError",
    "StoreError",
]

JOB_STEP_REUSED = "job_step_reused"


class JobRunError(Exception):
    """Root of jobrun's errors. ``code`` is stable; the message is for people."""

    code: str = "job_run_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class JobValidationError(JobRunError, ValueError):
    """Input was refused before anything was written.

    ``errors`` lists each problem as ``{"path": ..., "message": ...}`` where the
    path is dotted from the argument's name (``payload.source.bytes``).
    """

    code = "validation_failed"

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


class ArgumentTypeError(JobValidationError, TypeError):
    """An argument of the wrong type was refused before anything was written.

    A :class:`JobValidationError` like any other refusal (``errors`` names the
    argument), and also a ``TypeError``, as Python users expect of a wrong type.
    """


class HandlerMistakeError(JobValidationError):
    """A mistake in handler code that would fail the same way on every retry.

    Raised by the pass engine (a handler that returned ``None``, a ``done`` that
    is not a ``bool``, a step result JSON cannot store, a step name that breaks
    the name rules, a ``p.step`` never awaited, ...). When it ends a pass, the
    run is failed at once, with no backoff, and ``last_error`` says what to fix;
    after the fix, ``resume_job_run`` picks the run up where it stopped. A
    :class:`StepReusedError` that escapes the handler is treated the same way.
    """

    code = "handler_mistake"


class JobConflictError(JobRunError):
    """The request contradicts state that already exists; ``reason`` says which."""

    code = "conflict"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StepReusedError(JobConflictError):
    """A pass called ``step()`` twice under one name."""

    def __init__(self, step: str) -> None:
        super().__init__(
            f"step {step!r} was already called in this pass: one name stands for one unit "
            "of work, so a second call would get the first call's result back without "
            'doing its own work. Give each call its own name (e.g. f"fetch-{page}")',
            JOB_STEP_REUSED,
        )
        self.step = step


class RetryRule(Protocol):
    """What judges a failed step's next attempt: :class:`jobrun.RetryPolicy` is one.

    Named here, as the shape the errors need, so this bottom module names nothing
    of the core above it.
    """

    @property
    def max_attempts(self) -> int: ...

    def next_attempt_at(self, attempts: int, failed_at: str, random: Callable[[], float]) -> str:
        """When the run is due again after ``attempts`` failures, the last at ``failed_at``."""
        ...


class StepFailedError(JobRunError):
    """An attempt of a step failed, or the step had no attempts left.

    The pass that sees it fails unless the handler catches it; the run's retry is
    then judged by ``attempts`` against ``policy`` (the step's own policy).
    """

    code = "step_failed"

    def __init__(self, step: str, attempts: int, policy: RetryRule, cause: str) -> None:
        super().__init__(f"step {step!r} failed: {cause}")
        self.step = step
        self.attempts = attempts
        self.policy = policy
        self.cause_text = cause


class StepTimeoutError(StepFailedError):
    """A step's body ran past the step's ``timeout_s`` and was cancelled: a failed
    attempt like any other, retried by the step's policy."""

    code = "step_timeout"

    def __init__(self, step: str, attempts: int, policy: RetryRule, timeout_s: float) -> None:
        super().__init__(step, attempts, policy, timed_out_text(timeout_s))
        # The run's last error reads "step 'x' timed out after N s", not "failed: ...".
        self.message = f"step {step!r} {timed_out_text(timeout_s)}"
        self.args = (self.message,)
        self.timeout_s = timeout_s


def timed_out_text(timeout_s: float) -> str:
    """The ledger's last error of a step attempt that overran its ``timeout_s``."""
    return f"timed out after {timeout_s:g} s"


class PassTimeoutError(JobRunError):
    """A pass ran longer than the driver's ``pass_timeout_s``."""

    code = "pass_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the pass ran longer than its {timeout_s:g} s budget and was cancelled")
        self.timeout_s = timeout_s


class JobRunNotFoundError(JobRunError, LookupError):
    """An operator action named a run id that does not exist."""

    code = "not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no job run has the id {run_id!r}")
        self.run_id = run_id


class LeaseLostError(JobRunError):
    """The pass no longer holds its run: the lease expired and was taken over, or an
    operator cancelled or released the run. Raised at a step boundary; the pass
    writes nothing more and is reported as ``superseded``."""

    code = "lease_lost"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} is no longer held by this pass; it stops here")
        self.run_id = run_id


MAX_RETRY_AFTER_S = 30 * 24 * 3600.0
"""The longest delay a :class:`RetryAfter` asks for; a longer one is cut to it."""

MAX_DEFERRED_REASON_CHARS = 200
"""The longest reason a :class:`RetryAfter` keeps; a longer one is cut, ending in ``...``."""


class RetryAfter(JobRunError):
    """Raise it from a handler or a step body to say "not now, come back in ``seconds``".

    It is not a failure. The pass ends ``deferred``: nothing it did is committed
    (cursor, counters), no attempt is charged (the run's, the step's, the
    takeovers), the lease is given back, and the run is due again ``seconds``
    later. Steps that finished earlier in the pass stay in the ledger, so the
    next pass answers them without running them again. The run counts its
    deferrals in a row; past its job's ``max_deferrals`` (default 100) it fails.

    ``seconds`` is a finite number of at least 0 (a ``bool`` is refused); more
    than :data:`MAX_RETRY_AFTER_S` (30 days) is cut to it. ``reason`` (a str,
    shown by ``jobrun show`` and the console) is kept on one line of at most
    :data:`MAX_DEFERRED_REASON_CHARS` characters. A bad argument is a mistake in
    the code raising it: the constructor refuses it with a
    :class:`JobValidationError` (an :class:`ArgumentTypeError` for a wrong type),
    which then fails the pass like any other exception.

    ``rate_limit`` (a declared rate limit's key), raised from a step: the API
    behind that limit said "not now" to everyone, so the limit's bucket is held
    for ``seconds`` for every driver on every host (its takers wait, or defer
    their passes when that is beyond their budget), and health shows it cooling
    down with ``reason``.
    """

    code = "deferred"

    def __init__(self, seconds: float, reason: str = "", *, rate_limit: str | None = None) -> None:
        delay_s = _checked_delay_s(seconds)
        text = _one_line(reason)
        _checked_rate_limit(rate_limit)
        super().__init__(f"retry after {delay_s:g} s" + (f": {text}" if text else ""))
        self.seconds = delay_s
        self.reason = text
        self.rate_limit = rate_limit


def _checked_rate_limit(rate_limit: object) -> None:
    if rate_limit is not None and not isinstance(rate_limit, str):
        problem = f"must be a str (a rate limit's key), got {type(rate_limit).__name__}"
        raise ArgumentTypeError(
            f"RetryAfter(rate_limit) {problem}", [{"path": "rate_limit", "message": problem}]
        )


def _checked_delay_s(seconds: object) -> float:
    # Built here, not by jobrun._core.model.refusals: the bottom layer cannot import it.
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        problem = f"must be a number of seconds, got {type(seconds).__name__}"
        raise ArgumentTypeError(
            f"RetryAfter(seconds) {problem}", [{"path": "seconds", "message": problem}]
        )
    # An int is always finite (and math.isfinite would overflow on a huge one).
    if not ((isinstance(seconds, int) or math.isfinite(seconds)) and seconds >= 0):
        problem = f"must be a finite number of seconds of at least 0, got {seconds!r}"
        raise JobValidationError(
            f"RetryAfter(seconds) {problem}", [{"path": "seconds", "message": problem}]
        )
    return float(min(seconds, MAX_RETRY_AFTER_S))


def _one_line(reason: object) -> str:
    if not isinstance(reason, str):
        problem = f"must be a str, got {type(reason).__name__}"
        raise ArgumentTypeError(
            f"RetryAfter(reason) {problem}", [{"path": "reason", "message": problem}]
        )
    # Shown on one line by the console and the CLI: no newlines, no control
    # characters, no lone surrogates (which no database can store).
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    if len(text) > MAX_DEFERRED_REASON_CHARS:
        text = text[: MAX_DEFERRED_REASON_CHARS - 3] + "..."
    return text


class SchemaOutdatedError(JobRunError):
    """The database's jobrun schema is missing or older than this code."""

    code = "schema_outdated"

    def __init__(self, found: str | None, expected: str) -> None:
        where = "has no jobrun schema" if found is None else f"is at revision {found!r}"
        super().__init__(
            f"the database {where}; jobrun needs revision {expected!r}. Run "
            "`await jobrun.upgrade(engine)` or `jobrun db upgrade --url <url>` first"
        )
        self.found = found
        self.expected = expected


class CodeOutdatedError(JobRunError):
    """The database was migrated past what this jobrun may run against.

    Each revision records the oldest jobrun code that may still run against it;
    this code (of revision ``known``) is older than that (``needed``), on a
    database at ``found``. Upgrade jobrun where this runs, or stop it: workers of
    older code must be stopped before such a migration (docs/how-to/upgrade.md).
    """

    code = "code_outdated"

    def __init__(self, found: str, needed: str, known: str) -> None:
        super().__init__(
            f"this database is at revision {found} and needs jobrun code of revision "
            f"{needed} or later; this jobrun knows revision {known}: upgrade jobrun, "
            "or stop these workers"
        )
        self.found = found
        self.needed = needed
        self.known = known


class StoreError(JobRunError):
    """The database refused or failed an operation; ``__cause__`` is the original."""

    code = "store_failed"

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(f"{operation} failed: {type(cause).__name__}: {_first_line(cause)}")
        self.operation = operation


def _first_line(error: BaseException) -> str:
    text = _message_of(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def printable_text(text: str) -> str:
    """``text`` as every database stores it: lone surrogates (which UTF-8 cannot
    encode) and NUL (which Postgres text cannot hold) shown as escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _message_of(error: BaseException) -> str:
    """``str(error)``, or a stand-in when the exception's ``__str__`` misbehaves.

    User code can raise anything: a ``__str__`` that raises, or returns something
    other than a str, must not turn the recording of a failure into a failure.
    """
    try:
        text = str(error)
    except Exception as broken:
        return f"(its message could not be read: __str__ raised {type(broken).__name__})"
    # A str subclass may override anything; its plain text is what is stored.
    return text if type(text) is str else str.__str__(text)


def safe_message(error: BaseException) -> str:
    """``str(error)``, never raising, in text every database can store."""
    return printable_text(_message_of(error))


MAX_ORIGIN_CHARS = 300
"""An error origin longer than this keeps its end (the file name and the line)."""


def exception_origin(error: BaseException) -> str | None:
    """Where ``error`` was raised: ``"path:line in function"`` of the innermost frame
    of its traceback, or ``None`` without one.

    jobrun's own wrappers (a ``JobRunError`` raised ``from`` the user's exception,
    as a step failure is) are looked through to the exception they carry, so the
    origin is the user's raising frame, not jobrun's; jobrun's own errors have none.
    Never raises; printable, and
    at most ``MAX_ORIGIN_CHARS`` long (a long path loses its start).
    """
    try:
        seen = 0
        while isinstance(error, JobRunError) and error.__cause__ is not None and seen < 10:
            error, seen = error.__cause__, seen + 1
        frame = error.__traceback__
        # jobrun's own errors (a mistake, a budget spent) were raised in jobrun's code.
        if frame is None or isinstance(error, JobRunError):
            return None
        while frame.tb_next is not None:
            frame = frame.tb_next
        code = frame.tb_frame.f_code
        text = printable_text(f"{code.co_filename}:{frame.tb_lineno} in {code.co_name}")
    except Exception:
        return None
    return text if len(text) <= MAX_ORIGIN_CHARS else "..." + text[-(MAX_ORIGIN_CHARS - 3) :]


def describe_exception(error: BaseException) -> str:
    """The text stored for a failure: ``Type: message`` for foreign errors.

    ``str(KeyError('x'))`` alone is ``'x'``; the type makes it readable. jobrun's
    own errors already read as sentences, so they are stored as their message.
    Never raises, whatever the exception's ``__str__`` does, and the text it
    returns is storable: see :func:`printable_text`.
    """
    message = getattr(error, "message", None) if isinstance(error, JobRunError) else None
    if type(message) is str:
        return printable_text(message)
    text = _message_of(error)
    name = printable_text(type(error).__name__)
    return f"{name}: {printable_text(text)}" if text else name
