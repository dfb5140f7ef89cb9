"""Mistakes in handler code fail the run on that pass, say what to fix, and resume after the fix.

Each mistake would fail the same way on every retry, so none of them is retried
with backoff: the first pass ends the run ``failed``; ``resume_job_run`` after
the fix lets it finish. Runs on memory, SQLite and Postgres (``store`` fixture).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any, cast

import pytest

import jobrun
from jobrun.testing import FakeClock, MemoryJobRunStore
from tests.support import drive, row_of, set_columns, sized_store, start


class Truthy:
    """Not a bool, though it says True when asked (what numpy.bool_ does too)."""

    def __bool__(self) -> bool:
        return True


def _numpy_true() -> Any:
    numpy = pytest.importorskip("numpy", reason="numpy is not installed; Truthy stands in")
    return numpy.bool_(True)


async def _fails_at_once(
    store: Any, clock: FakeClock, handler: Callable[..., Any], **run: Any
) -> tuple[jobrun.JobRun, jobrun.JobDriveReport]:
    """Drive one pass of a fresh run; it must end ``failed`` on it, with no backoff."""
    registry = jobrun.JobRegistry()
    registry.register("crm", "import", handler)
    started = await start(store, clock, **run)
    report = await drive(store, registry, clock)
    assert (report.attempted, report.failed, report.retrying) == (1, 1, 0), report
    after = await jobrun.get_job_run(store, started.id)
    assert after is not None
    assert after.status == "failed"
    assert after.next_attempt_at is None
    assert after.ended_at is not None
    assert after.last_error == report.errors[0].error
    return after, report


async def _resume_and_finish(store: Any, clock: FakeClock, run_id: str) -> jobrun.JobRun:
    registry = jobrun.JobRegistry()

    async def fixed(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("fixed", lambda: 1)
        return jobrun.PassResult(done=True)

    registry.register("crm", "import", fixed)
    await jobrun.resume_job_run(store, run_id, clock=clock)
    report = await drive(store, registry, clock)
    assert report.completed == 1, report
    finished = await jobrun.get_job_run(store, run_id)
    assert finished is not None
    assert finished.status == "done"
    return finished


# --- what a handler returns ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (None, "the handler returned None: did you forget `return`?"),
        ({"done": 1}, "the handler returned done=1 (an int): done must be True or False"),
        (jobrun.PassResult(done=1), "the handler returned done=1 (an int)"),  # type: ignore[arg-type]
        (jobrun.PassResult(done=Truthy()), "done must be True or False"),  # type: ignore[arg-type]
        ({"curser": 3}, "the handler returned unknown key(s) 'curser'"),
        ([1, 2], "the handler returned a list: return PassResult(cursor=..., done=...)"),
        (jobrun.PassResult(cursor={1, 2}), "the handler returned a cursor that cannot be stored"),
    ],
    ids=[
        "none",
        "done-int",
        "passresult-done-int",
        "done-truthy",
        "typo-key",
        "list",
        "cursor-set",
    ],
)
async def test_a_bad_handler_result_fails_the_run_at_once(
    store: Any, clock: FakeClock, returned: Any, expected: str
) -> None:
    calls = 0

    def handler(p: jobrun.JobPass) -> Any:
        nonlocal calls
        calls += 1
        return returned

    failed, _ = await _fails_at_once(store, clock, handler)
    assert expected in (failed.last_error or ""), failed.last_error
    assert calls == 1
    await _resume_and_finish(store, clock, failed.id)


def _generator(p: jobrun.JobPass) -> Any:
    yield jobrun.PassResult(done=True)


async def _async_generator(p: jobrun.JobPass) -> Any:
    yield jobrun.PassResult(done=True)


@types.coroutine
def _awaitable_generator(p: jobrun.JobPass) -> Any:
    # Awaitable, so without the check asyncio would fail it with "Task got bad yield"
    # on every retry.
    yield jobrun.PassResult(done=True)


async def _returns_a_coroutine(p: jobrun.JobPass) -> Any:
    async def inner() -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    return inner()


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (_generator, "the handler returned a generator: a handler is a plain or `async def`"),
        (_async_generator, "the handler returned an async_generator: a handler is"),
        (_awaitable_generator, "the handler returned a generator: a handler is"),
        (_returns_a_coroutine, "the handler returned a coroutine: return PassResult("),
    ],
    ids=["generator", "async-generator", "awaitable-generator", "coroutine"],
)
async def test_a_handler_of_the_wrong_kind_fails_the_run_at_once(
    store: Any, clock: FakeClock, handler: Any, expected: str
) -> None:
    failed, _ = await _fails_at_once(store, clock, handler)
    assert expected in (failed.last_error or ""), failed.last_error
    await _resume_and_finish(store, clock, failed.id)


async def test_numpy_bool_done_is_refused(store: Any, clock: FakeClock) -> None:
    true = _numpy_true()
    failed, _ = await _fails_at_once(store, clock, lambda p: {"done": true})
    assert "done must be True or False" in (failed.last_error or "")
    assert "numpy" in (failed.last_error or "")


async def test_the_error_is_a_handler_mistake_with_its_own_code() -> None:
    error = jobrun.HandlerMistakeError("x", [])
    assert error.code == "handler_mistake"
    assert isinstance(error, jobrun.JobValidationError)


# --- steps ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({1, 2}, "not JSON (Object of type set is not JSON serializable)"),
        (math.nan, "nan, which JSON cannot store"),
        ("x" * 300, "over the 100-byte cap"),
    ],
    ids=["set", "nan", "over-cap"],
)
async def test_a_step_result_that_cannot_be_stored_never_runs_the_body_again(
    store: Any, engine: Any, clock: FakeClock, value: Any, expected: str
) -> None:
    store = sized_store(store, engine, max_step_result_bytes=100)
    bodies = 0

    def body() -> Any:
        nonlocal bodies
        bodies += 1
        return value

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("unstorable", body)
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert bodies == 1
    assert failed.last_error is not None
    assert failed.last_error.startswith("step 'unstorable' returned a value that cannot be stored")
    assert expected in failed.last_error
    # Driving again does nothing: the run is failed, the body is not called.
    registry = jobrun.JobRegistry()
    registry.register("crm", "import", handler)
    clock.advance(seconds=3600)
    assert (await drive(store, registry, clock)).attempted == 0
    assert bodies == 1
    await _resume_and_finish(store, clock, failed.id)


async def test_a_reused_step_name_that_escapes_fails_at_once(store: Any, clock: FakeClock) -> None:
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step("page", lambda: 1)
        await p.step("page", lambda: 2)
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert "step 'page' was already called in this pass" in (failed.last_error or "")
    assert "Give each call its own name" in (failed.last_error or "")
    await _resume_and_finish(store, clock, failed.id)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("x" * 3000, "is 3000 bytes of UTF-8, over the 512-byte limit for names"),
        ("bad\udcff", "is not valid Unicode: a lone surrogate at character 3"),
        ("nul\x00", "contains a NUL character"),
        ("", "is empty"),
        (7, "a step name must be a str, got int"),
    ],
    ids=["long", "surrogate", "nul", "empty", "int"],
)
async def test_a_bad_step_name_fails_before_its_body_runs(
    store: Any, clock: FakeClock, name: Any, expected: str
) -> None:
    bodies = 0

    def body() -> int:
        nonlocal bodies
        bodies += 1
        return 1

    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        await p.step(name, body)
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert bodies == 0
    assert expected in (failed.last_error or "")
    if not isinstance(name, str) or name:
        assert (failed.last_error or "").startswith(("step name", "a step name"))


async def test_an_unawaited_step_fails_the_pass_and_nothing_warns(
    store: Any, clock: FakeClock
) -> None:
    bodies = 0

    def body() -> int:
        nonlocal bodies
        bodies += 1
        return 1

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.step("forgotten", body)  # no await: the step never runs
        return jobrun.PassResult(done=True)

    # pytest turns warnings into errors: a "never awaited" RuntimeWarning would fail this.
    failed, _ = await _fails_at_once(store, clock, handler)
    assert bodies == 0
    assert failed.last_error == (
        "p.step('forgotten', ...) was called without `await`, so the step never ran: "
        "write `await p.step(...)` (the handler must be `async def`)"
    )
    await _resume_and_finish(store, clock, failed.id)


async def test_an_unawaited_step_wins_over_the_error_it_caused(
    store: Any, clock: FakeClock
) -> None:
    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        page = p.step("page", lambda: {"items": []})
        return jobrun.PassResult(cursor=page["items"])  # type: ignore[index]

    failed, _ = await _fails_at_once(store, clock, handler)
    assert "was called without `await`" in (failed.last_error or "")


# --- counters -------------------------------------------------------------------------------


async def test_counters_are_read_only_to_the_handler(store: Any, clock: FakeClock) -> None:
    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.counters["x"] = "text"  # type: ignore[index]
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert failed.last_error == (
        "p.counters['x'] = ... : p.counters is read-only; use p.count('x', by) to add to a counter"
    )
    assert failed.counters == {}


@pytest.mark.parametrize(
    ("name", "by", "expected"),
    [
        ("x", "text", "p.count('x', by='text'): by must be a finite int or float"),
        ("x", math.inf, "by must be a finite int or float"),
        # An int no float can hold: JSON would store it, but no counter could read it.
        ("x", 10**400, "p.count('x', by=an int of about 401 digits): by must be a finite"),
        ("x", -(10**309), "by=an int of about 310 digits"),
        ("x" * 600, 1, "over the 512-byte limit for names"),
        (3, 1, "p.count() got a counter name of type int: use a str"),
    ],
    ids=["text", "inf", "huge-int", "huge-negative-int", "long-name", "int-name"],
)
async def test_a_bad_count_fails_at_once(
    store: Any, clock: FakeClock, name: Any, by: Any, expected: str
) -> None:
    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count(name, by)
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert expected in (failed.last_error or "")


@pytest.mark.parametrize("first", [1.5e308, 10**308], ids=["float", "int"])
async def test_a_count_that_overflows_a_float_fails_at_once(
    store: Any, clock: FakeClock, first: int | float
) -> None:
    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("x", first)
        p.count("x", 10**308)
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert "counter 'x' would overflow to" in (failed.last_error or "")
    assert failed.counters == {}


async def test_counters_over_their_cap_fail_at_once(
    store: Any, engine: Any, clock: FakeClock
) -> None:
    store = sized_store(store, engine, max_counters_bytes=200)

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for item in range(100):
            p.count(f"item-{item}")
        return jobrun.PassResult(done=True)

    failed, _ = await _fails_at_once(store, clock, handler)
    assert "the counters are at least" in (failed.last_error or "")
    assert "over the 200-byte cap" in (failed.last_error or "")
    assert failed.counters == {}


@pytest.mark.parametrize(
    ("stored", "repaired"),
    [
        ('{"good":3,"bad":"text"}', {"good": 3}),
        ("[1,2]", {}),
        ("not json", {}),
    ],
    ids=["bad-entry", "not-an-object", "not-json"],
)
async def test_a_run_with_malformed_counters_fails_at_once_and_resumes_repaired(
    store: Any, engine: Any, clock: FakeClock, stored: str, repaired: dict[str, int]
) -> None:
    registry = jobrun.JobRegistry()

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("good")
        return jobrun.PassResult(done=True)

    registry.register("crm", "import", handler)
    run = await start(store, clock)
    await set_columns(store, engine, run.id, counters=stored)
    report = await drive(store, registry, clock)
    assert report.failed == 1
    assert report.retrying == 0
    failed = await jobrun.get_job_run(store, run.id)
    assert failed is not None
    assert failed.status == "failed"
    assert "counters is not valid JSON" in (failed.last_error or "")
    assert "Resuming the run keeps its valid counters" in (failed.last_error or "")

    resumed = await jobrun.resume_job_run(store, run.id, clock=clock)
    assert resumed.counters == repaired
    assert resumed.decode_error is None
    assert (await drive(store, registry, clock)).completed == 1
    done = await jobrun.get_job_run(store, run.id)
    assert done is not None
    assert done.counters == {**repaired, "good": repaired.get("good", 0) + 1}


# --- user code keeps its retries ---------------------------------------------------------------


async def test_an_exception_from_user_code_still_retries(store: Any, clock: FakeClock) -> None:
    registry = jobrun.JobRegistry()

    def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        raise TimeoutError("upstream timed out")

    registry.register("crm", "import", handler)
    run = await start(store, clock)
    report = await drive(store, registry, clock)
    assert report.retrying == 1
    assert report.failed == 0
    assert (await row_of(store, run.id)).status == "running"


def _write_counter(p: jobrun.JobPass) -> None:
    cast(Any, p.counters)["rows"] = 5


def _delete_counter(p: jobrun.JobPass) -> None:
    del cast(Any, p.counters)["rows"]


def _count_with_a_bad_name(p: jobrun.JobPass) -> None:
    p.count(cast(Any, 5))


async def test_misusing_p_counters_is_a_mistake_about_the_counters() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    run = await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    seen: dict[str, Any] = {}
    registry = jobrun.JobRegistry()

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        p.count("rows", 2)
        seen["shown"] = repr(p.counters)
        seen["errors"] = []
        for misuse in (_write_counter, _delete_counter, _count_with_a_bad_name):
            with pytest.raises(jobrun.HandlerMistakeError) as caught:
                misuse(p)
            seen["errors"].append((caught.value.errors, str(caught.value)))
        return jobrun.PassResult(done=True)

    assert (await jobrun.run_due_jobs(store, registry, clock=clock)).completed == 1
    assert seen["shown"] == "{'rows': 2}"
    assert [errors for errors, _ in seen["errors"]] == [
        [{"path": "counters", "message": text}] for _, text in seen["errors"]
    ]
    assert ["read-only" in text for _, text in seen["errors"]] == [True, True, False]
    assert "use a str" in seen["errors"][2][1]
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.counters == {"rows": 2}, "a refused write changed nothing"


async def test_a_step_result_that_cannot_be_stored_is_a_mistake_about_that_step() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    caught: list[jobrun.HandlerMistakeError] = []

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        try:
            await p.step("load", lambda: {1, 2})
        except jobrun.HandlerMistakeError as error:
            caught.append(error)
        return jobrun.PassResult(done=True)

    await jobrun.run_due_jobs(store, registry, clock=clock)
    [error] = caught
    assert error.errors == [
        {"path": "step.load", "message": "not JSON (Object of type set is not JSON serializable)"}
    ]
    assert str(error).endswith("the body ran once and is not run again until the run is resumed"), (
        "the text says what happens next"
    )


async def test_a_step_call_refused_before_it_runs_is_a_mistake_about_the_step() -> None:
    store, clock = MemoryJobRunStore(), FakeClock()
    await jobrun.start_job_run(store, module_id="m", job="j", clock=clock)
    registry = jobrun.JobRegistry()
    paths: list[list[str]] = []

    @registry.job("m", "j")
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        for name, retry in (("", None), ("s", cast(Any, 3))):
            try:
                p.step(name, lambda: 1, retry=retry)
            except jobrun.HandlerMistakeError as error:
                paths.append([entry["path"] for entry in error.errors])
        return jobrun.PassResult(done=True)

    await jobrun.run_due_jobs(store, registry, clock=clock)
    assert paths == [["step"], ["step"]]
