"""Job versions (``jobrun/_core/rules/versions.py``): ``version`` and ``upgrade`` checked before
anything is registered, the upgrade functions kept in version order, a stored cursor upgraded
from its own version on, and the runs a newer version left that this code cannot take."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import jobrun
from jobrun._core.rules.versions import runs_beyond_code, upgraded_cursor
from tests.support import done_at_once


def plain(cursor: Any) -> Any:
    return cursor


async def coroutine_function(cursor: Any) -> Any:
    return cursor


def generator_function(cursor: Any) -> Iterator[Any]:
    yield cursor


async def async_generator_function(cursor: Any) -> AsyncIterator[Any]:
    yield cursor


def test_unversioned_is_version_1_with_no_upgrades() -> None:
    registry = jobrun.JobRegistry()
    registry.register("m", "j", done_at_once)
    job = registry.get("m", "j")
    assert job is not None
    assert (job.version, job.upgrades) == (1, ())


def test_the_upgrade_functions_are_kept_in_version_order_and_the_decorator_takes_them() -> None:
    def first(cursor: Any) -> Any:
        return cursor

    registry = jobrun.JobRegistry()

    @registry.job("m", "j", version=3, upgrade={2: plain, 1: first})
    async def handler(p: jobrun.JobPass) -> jobrun.PassResult:
        return jobrun.PassResult(done=True)

    job = registry.get("m", "j")
    assert job is not None
    assert (job.version, job.upgrades, job.handler) == (3, (first, plain), handler)


@pytest.mark.parametrize(
    ("version", "upgrade", "path", "words"),
    [
        (0, None, "version", "at least 1, got 0"),
        (-2, None, "version", "at least 1"),
        (True, None, "version", "must be an int, got bool"),
        (2.0, None, "version", "must be an int, got float"),
        ("2", None, "version", "must be an int, got str"),
        (2, None, "upgrade", "lacks a function for version 1"),
        (2, {}, "upgrade", "lacks a function for version 1"),
        (3, {1: plain}, "upgrade", "lacks a function for version 2"),
        (1, {1: plain}, "upgrade", "keys 1 that are no older version"),
        (2, {1: plain, 2: plain}, "upgrade", "keys 2 that are no older version"),
        (2, {0: plain, 1: plain}, "upgrade", "keys 0"),
        (2, {"1": plain}, "upgrade", "keys '1'"),
        (2, {True: plain}, "upgrade", "keys True"),
        (2, [plain], "upgrade", "must be a dict of version to function, got list"),
        (2, {1: "not a function"}, "upgrade.1", "is not callable (got str)"),
        (2, {1: coroutine_function}, "upgrade.1", "is an `async def` function"),
        (2, {1: generator_function}, "upgrade.1", "is a generator function"),
        (2, {1: async_generator_function}, "upgrade.1", "is an async generator function"),
        (3, {1: plain, 2: coroutine_function}, "upgrade.2", "plain synchronous function"),
    ],
)
def test_a_bad_version_or_upgrade_is_refused_and_nothing_is_registered(
    version: Any, upgrade: Any, path: str, words: str
) -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError) as refused:
        registry.register("m", "j", done_at_once, version=version, upgrade=upgrade)
    assert refused.value.errors[0]["path"] == path
    assert words in str(refused.value)
    assert ("m", "j") not in registry
    with pytest.raises(jobrun.JobValidationError):
        registry.job("m", "j", version=version, upgrade=upgrade)(done_at_once)


def test_a_cursor_is_upgraded_from_its_own_version_on() -> None:
    steps = (lambda c: [*c, "to 2"], lambda c: [*c, "to 3"], lambda c: [*c, "to 4"])
    assert upgraded_cursor([], 1, steps) == ["to 2", "to 3", "to 4"]
    assert upgraded_cursor([], 3, steps) == ["to 4"]
    assert upgraded_cursor([], 4, steps) == []


def test_an_upgrade_returning_an_awaitable_is_a_mistake() -> None:
    with pytest.raises(jobrun.HandlerMistakeError, match="version 1 returned coroutine"):
        upgraded_cursor(None, 1, (coroutine_function,))


def test_runs_beyond_code_counts_only_newer_versions_of_the_codes_jobs() -> None:
    by_version = {("m", "a"): {1: 4, 2: 3, 5: 1}, ("m", "b"): {3: 2}, ("x", "y"): {9: 1}}
    assert runs_beyond_code(by_version, {("m", "a"): 1, ("m", "b"): 3}) == {("m", "a"): (4, 2)}
    assert runs_beyond_code(by_version, {("m", "a"): 5, ("m", "c"): 1}) == {}
