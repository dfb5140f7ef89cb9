"""JobRegistry: one handler per (module_id, name) pair, and the job's options checked as it is
registered (its version and upgrades: ``rules/test_versions.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

import jobrun
from tests.support import done_at_once


def handler(p: jobrun.JobPass) -> None:
    return None


async def other_handler(p: jobrun.JobPass) -> None:
    return None


def test_register_then_get() -> None:
    registry = jobrun.JobRegistry()
    policy = jobrun.RetryPolicy(max_attempts=2)
    registry.register("crm", "sync", handler, retry=policy)
    job = registry.get("crm", "sync")
    assert job is not None
    assert (job.module_id, job.name, job.handler, job.retry) == ("crm", "sync", handler, policy)
    assert ("crm", "sync") in registry
    assert len(registry) == 1
    assert [entry.name for entry in registry] == ["sync"]


def test_retry_defaults_to_none() -> None:
    registry = jobrun.JobRegistry()
    registry.register("crm", "sync", handler)
    job = registry.get("crm", "sync")
    assert job is not None
    assert job.retry is None


def test_unknown_jobs_are_absent() -> None:
    registry = jobrun.JobRegistry()
    registry.register("crm", "sync", handler)
    assert registry.get("crm", "other") is None
    assert registry.get("other", "sync") is None
    assert ("crm", "other") not in registry


def test_the_decorator_registers_and_returns_the_function_unchanged() -> None:
    registry = jobrun.JobRegistry()
    policy = jobrun.RetryPolicy(base_delay_ms=0)

    @registry.job("crm", "walk", retry=policy)
    async def walk(p: jobrun.JobPass) -> None:
        return None

    job = registry.get("crm", "walk")
    assert job is not None
    assert job.handler is walk
    assert job.retry is policy
    assert walk.__name__ == "walk"


def test_a_duplicate_pair_is_a_conflict_and_keeps_the_first_handler() -> None:
    registry = jobrun.JobRegistry()
    registry.register("crm", "sync", handler)
    with pytest.raises(jobrun.JobConflictError) as caught:
        registry.register("crm", "sync", other_handler)
    assert caught.value.code == "conflict"
    assert isinstance(caught.value, jobrun.JobRunError)
    assert "crm" in str(caught.value)
    assert "sync" in str(caught.value)
    with pytest.raises(jobrun.JobConflictError):
        registry.job("crm", "sync")(other_handler)
    job = registry.get("crm", "sync")
    assert job is not None
    assert job.handler is handler
    assert len(registry) == 1


def test_the_same_name_in_another_module_is_another_job() -> None:
    registry = jobrun.JobRegistry()
    registry.register("crm", "sync", handler)
    registry.register("billing", "sync", other_handler)
    assert len(registry) == 2


def test_the_key_is_the_pair_not_a_joined_string() -> None:
    registry = jobrun.JobRegistry()
    registry.register("a/b", "c", handler)
    registry.register("a", "b/c", other_handler)
    first, second = registry.get("a/b", "c"), registry.get("a", "b/c")
    assert first is not None
    assert second is not None
    assert (first.handler, second.handler) == (handler, other_handler)
    assert len(registry) == 2


@pytest.mark.parametrize("argument", ["module_id", "name"])
def test_empty_names_are_refused(argument: str) -> None:
    names = {"module_id": "crm", "name": "sync", argument: ""}
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError) as caught:
        registry.register(names["module_id"], names["name"], handler)
    assert caught.value.errors[0]["path"] == argument
    assert argument in str(caught.value)
    assert len(registry) == 0


@pytest.mark.parametrize("argument", ["module_id", "name"])
@pytest.mark.parametrize("bad", [None, 1, b"crm", ["crm"], ("crm",)], ids=repr)
def test_non_str_names_are_refused(argument: str, bad: Any) -> None:
    names: dict[str, Any] = {"module_id": "crm", "name": "sync", argument: bad}
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match=argument):
        registry.register(names["module_id"], names["name"], handler)
    assert len(registry) == 0


# Named ids: repr(object()) holds an address, so the id would change per process and a
# tool that lists the tests once and runs them later (mutmut) would not find it.
@pytest.mark.parametrize(
    "bad", [None, "handler", 42, object()], ids=["None", "'handler'", "42", "object()"]
)
def test_a_non_callable_handler_is_refused(bad: Any) -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match="callable"):
        registry.register("crm", "sync", bad)
    assert len(registry) == 0


@pytest.mark.parametrize(
    "bad",
    [{"max_attempts": 3}, 3, "fast", (5, 1000, 300_000)],
    ids=repr,
)
def test_retry_must_be_a_retry_policy(bad: Any) -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(TypeError, match="RetryPolicy"):
        registry.register("crm", "sync", handler, retry=bad)
    with pytest.raises(TypeError, match="RetryPolicy"):
        registry.job("crm", "sync", retry=bad)(handler)
    assert len(registry) == 0


def test_a_max_concurrent_of_the_wrong_type_is_named_with_its_type() -> None:
    with pytest.raises(TypeError, match=r"^max_concurrent must be an int or None, got str$"):
        jobrun.JobRegistry().register("m", "j", done_at_once, max_concurrent=cast(Any, "2"))


def test_a_registered_job_keeps_its_limit_and_its_retention() -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "j", done_at_once, max_concurrent=3, keep_for=timedelta(hours=1))
    registered = registry.get("m", "j")
    assert registered is not None
    assert (registered.max_concurrent, registered.keep_for) == (3, timedelta(hours=1))


def test_a_keep_for_of_the_wrong_type_is_named_with_its_type() -> None:
    with pytest.raises(TypeError, match=r"^keep_for must be a timedelta or None, got int$"):
        jobrun.JobRegistry().register("m", "j", done_at_once, keep_for=cast(Any, 5))


@pytest.mark.parametrize(("value", "kind"), [(-1, ValueError), (True, TypeError), (1.5, TypeError)])
def test_max_deferrals_is_checked_at_registration(value: Any, kind: type[Exception]) -> None:
    with pytest.raises(kind):
        jobrun.JobRegistry().register("m", "j", done_at_once, max_deferrals=value)
