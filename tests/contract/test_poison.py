"""Nothing a handler raises poisons the driver: an exception from user code is a
failed attempt of its run, recorded with a readable ``last_error``, its lease released.

* A ``CancelledError`` raised by user code while nobody cancels the pass, a
  ``GeneratorExit``: an ordinary failed attempt.
* A ``BaseException`` class of the user's own (what tests raise to stand for the
  process dying): the pass stops, nothing recorded, the lease handed back.
* ``KeyboardInterrupt`` and ``SystemExit`` (``sys.exit()`` in a step): recorded the
  same way, then raised again by ``run_due_jobs`` (so they still stop a program);
  the worker's drive reports them and goes on (``drive_due_jobs(on_user_exit=...)``).
* An exception whose text cannot be read or stored still makes a clean record.

A real cancellation of the pass is not a failure: see ``test_faults.py``
(``task-cancelled``). Runs on memory, SQLite and Postgres (``store`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

import jobrun
from jobrun._api import SYSTEM_SOURCES
from jobrun._core.engine.drive import drive_due_jobs
from jobrun._core.engine.options import DriveOptions
from jobrun._core.model.records import RunKey, StepRow
from jobrun.testing import FakeClock
from tests.support import drive, fixed_random, row_of, start_id

MODULE, JOB = "crm", "import"
IMMEDIATE = jobrun.RetryPolicy(max_attempts=5, base_delay_ms=0)


class OwnBaseException(BaseException):
    """A BaseException of the user's own (as some libraries define for "abort")."""


def _make(kind: type[BaseException]) -> BaseException:
    return kind(3) if kind is SystemExit else kind()


class Poisoned:
    """A job of one pass: step ``a``, then ``raised`` from ``where`` on the first pass
    only (step ``b``'s body, the handler itself, or the host's ``open_scope``)."""

    def __init__(self, where: str, raised: type[BaseException]) -> None:
        self.where = where
        self.raised = raised
        self.calls: list[str] = []
        self.armed = True

    def _fire(self, at: str) -> None:
        if self.armed and self.where == at:
            self.armed = False
            raise _make(self.raised)

    async def handler(self, p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("passes")
        await p.step("a", lambda: self.calls.append("a") or "A")
        self._fire("handler")
        await p.scope()
        await p.step("b", self._b)
        return jobrun.PassResult(cursor="end", done=True)

    async def _b(self) -> str:
        self.calls.append("b")
        self._fire("step")
        return "B"

    def open_scope(self, _run: RunKey) -> str:
        self._fire("scope")
        return "scope"

    def registry(self, retry: jobrun.RetryPolicy = IMMEDIATE) -> jobrun.JobRegistry:
        registry = jobrun.JobRegistry()
        registry.register(MODULE, JOB, self.handler, retry=retry)
        return registry


def _expected_error(where: str, raised: type[BaseException]) -> str:
    text = "SystemExit: 3" if raised is SystemExit else raised.__name__
    if where == "step":
        text = f"step 'b' failed: {text} raised by the step's code"
    else:
        text = f"{text} raised by the handler's code"
    if raised is asyncio.CancelledError:
        text += " (not a cancellation of the pass)"
    return text


async def _assert_recorded(store: Any, run_id: str, where: str, raised: type[BaseException]):
    """One failed attempt on the record, the lease released, the ledger kept."""
    row = await row_of(store, run_id)
    assert row.status == "running"
    assert (row.attempts, row.lease_owner, row.cursor, row.counters) == (1, None, None, "{}")
    assert row.last_error == _expected_error(where, raised)
    ledger = await store.steps(run_id)
    assert ledger["a"] == StepRow("a", '"A"', 1, None)
    if where == "step":
        assert ledger["b"].attempts == 1
        assert ledger["b"].result is None
    else:
        assert set(ledger) == {"a"}


async def _finishes_from_the_ledger(store: Any, clock: FakeClock, job: Poisoned, run_id: str):
    report = await drive(store, job.registry(), clock, open_scope=job.open_scope)
    assert report.completed == 1, report
    row = await row_of(store, run_id)
    assert (row.status, row.cursor, row.counters, row.attempts) == (
        "done",
        '"end"',
        '{"passes":1}',
        0,
    )
    assert job.calls.count("a") == 1, "a recorded step ran again"


WHERE = ["step", "handler", "scope"]
FAILURES = [
    pytest.param(asyncio.CancelledError, id="cancelled-error"),
    pytest.param(GeneratorExit, id="generator-exit"),
]
EXITS = [
    pytest.param(KeyboardInterrupt, id="keyboard-interrupt"),
    pytest.param(SystemExit, id="system-exit"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("raised", FAILURES)
async def test_a_base_exception_from_user_code_is_a_failed_attempt(
    store: Any, clock: FakeClock, where: str, raised: type[BaseException]
) -> None:
    job = Poisoned(where, raised)
    run_id = await start_id(store, clock)
    report = await drive(store, job.registry(), clock, open_scope=job.open_scope)
    assert (report.attempted, report.retrying, report.superseded) == (1, 1, 0), report
    await _assert_recorded(store, run_id, "step" if where == "step" else "handler", raised)
    assert report.errors[0].error == (await row_of(store, run_id)).last_error
    await _finishes_from_the_ledger(store, clock, job, run_id)


@pytest.mark.parametrize("where", WHERE)
async def test_a_base_exception_of_the_users_own_stops_the_pass_like_a_crash(
    store: Any, clock: FakeClock, where: str
) -> None:
    """What tests raise to stand for the process dying: nothing recorded, the lease
    handed back, raised on; the next drive finishes from the ledger."""
    job = Poisoned(where, OwnBaseException)
    run_id = await start_id(store, clock)
    with pytest.raises(OwnBaseException):
        await drive(store, job.registry(), clock, open_scope=job.open_scope)
    row = await row_of(store, run_id)
    assert (row.status, row.attempts, row.last_error, row.lease_owner) == ("running", 0, None, None)
    await _finishes_from_the_ledger(store, clock, job, run_id)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("raised", EXITS)
async def test_an_exit_from_user_code_is_recorded_then_raised_again(
    store: Any, clock: FakeClock, where: str, raised: type[BaseException]
) -> None:
    job = Poisoned(where, raised)
    run_id = await start_id(store, clock)
    with pytest.raises(raised):
        await drive(store, job.registry(), clock, open_scope=job.open_scope)
    await _assert_recorded(store, run_id, "step" if where == "step" else "handler", raised)
    # Released by the record: due again at once, no lease to wait out.
    await _finishes_from_the_ledger(store, clock, job, run_id)


async def test_an_exit_on_the_last_attempt_fails_the_run_and_is_raised(
    store: Any, clock: FakeClock
) -> None:
    job = Poisoned("step", SystemExit)
    run_id = await start_id(store, clock)
    with pytest.raises(SystemExit):
        await drive(store, job.registry(jobrun.RetryPolicy(max_attempts=1)), clock)
    row = await row_of(store, run_id)
    assert (row.status, row.lease_owner) == ("failed", None)
    assert row.last_error == "step 'b' failed: SystemExit: 3 raised by the step's code"


async def test_a_handler_that_swallows_a_step_exit_is_not_held_to_it(
    store: Any, clock: FakeClock
) -> None:
    """The step attempt is recorded; what the handler then does is its own choice."""

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        with contextlib.suppress(SystemExit):
            await p.step("exits", lambda: _raise(SystemExit(0)))
        return jobrun.PassResult(cursor="went-on")

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock)
    assert report.advanced == 1
    row = await row_of(store, run_id)
    assert (row.cursor, row.attempts, row.lease_owner) == ('"went-on"', 0, None)


def _raise(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize("raised", EXITS)
async def test_the_workers_drive_reports_an_exit_and_goes_on_with_other_runs(
    store: Any, clock: FakeClock, raised: type[BaseException]
) -> None:
    job = Poisoned("step", raised)
    registry = job.registry()

    async def fine(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("only", lambda: 1)
        return jobrun.PassResult(done=True)

    registry.register(MODULE, "fine", fine)
    poisoned = await start_id(store, clock)
    healthy = await start_id(store, clock, job="fine")
    exits: list[tuple[RunKey, BaseException]] = []
    options = DriveOptions(clock=clock, random=fixed_random, open_scope=job.open_scope)
    report = await drive_due_jobs(
        store,
        registry,
        options,
        SYSTEM_SOURCES,
        on_user_exit=lambda run, error: exits.append((run, error)),
    )
    assert (report.attempted, report.retrying, report.completed) == (2, 1, 1), report
    assert [(run.id, type(error)) for run, error in exits] == [(poisoned, raised)]
    assert (await row_of(store, healthy)).status == "done"
    await _assert_recorded(store, poisoned, "step", raised)


class Unreadable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class NotText(Exception):
    def __str__(self) -> Any:
        return 42


class TextSubclass(str):
    def __str__(self) -> str:
        raise RuntimeError("a str subclass with a broken __str__")


class SubclassText(Exception):
    def __str__(self) -> str:
        return TextSubclass("plain words")


BAD_TEXTS: list[Any] = [
    pytest.param(
        lambda: ValueError("lone \ud800 surrogate"),
        "ValueError: lone \\ud800 surrogate",
        id="lone-surrogate",
    ),
    pytest.param(
        Unreadable,
        "Unreadable: (its message could not be read: __str__ raised RuntimeError)",
        id="str-raises",
    ),
    pytest.param(
        NotText,
        "NotText: (its message could not be read: __str__ raised TypeError)",
        id="str-not-text",
    ),
    pytest.param(SubclassText, "SubclassText: plain words", id="str-subclass"),
    pytest.param(lambda: ValueError("nul \x00 here"), "ValueError: nul \\x00 here", id="nul"),
    pytest.param(
        lambda: jobrun.JobRunError("own \udfff error"), "own \\udfff error", id="own-error"
    ),
]


@pytest.mark.parametrize("in_step", [False, True], ids=["handler", "step"])
@pytest.mark.parametrize(("make", "expected"), BAD_TEXTS)
async def test_an_error_whose_text_misbehaves_is_still_recorded(
    store: Any, clock: FakeClock, in_step: bool, make: Callable[[], Exception], expected: str
) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        if in_step:
            await p.step("s", lambda: _raise(make()))
        raise make()

    registry = jobrun.JobRegistry()
    registry.register(MODULE, JOB, handler, retry=IMMEDIATE)
    run_id = await start_id(store, clock)
    report = await drive(store, registry, clock)
    assert (report.attempted, report.retrying) == (1, 1), report
    row = await row_of(store, run_id)
    assert row.lease_owner is None, "the failure record released the lease"
    assert row.last_error == (f"step 's' failed: {expected}" if in_step else expected)
    assert report.errors[0].error == row.last_error
    if in_step:
        assert (await store.steps(run_id))["s"].last_error == expected


def test_describe_exception_never_raises() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise Unreadable()

    assert jobrun.errors.describe_exception(Hostile()) == (
        "Hostile: (its message could not be read: __str__ raised Unreadable)"
    )
    assert jobrun.errors.describe_exception(KeyError("x")) == "KeyError: 'x'"
