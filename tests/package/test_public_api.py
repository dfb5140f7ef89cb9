"""The public surface: what ``import jobrun`` and ``jobrun.testing`` offer, sorted, lazy where
they can be, and light to import (the errors are tested in ``unit/test_errors.py``, the
records in ``unit/model/test_records.py``)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from typing import Any

import pytest

import jobrun
import jobrun.errors
import jobrun.testing

REQUIRED_NAMES = {
    "upgrade",
    "SqlJobRunStore",
    "JobRegistry",
    "RetryPolicy",
    "JobPass",
    "PassResult",
    "start_job_run",
    "run_due_jobs",
    "job_runs",
    "get_job_run",
    "assert_queue_safe",
    "job_run_list_limit",
    "JobRun",
    "JobRunStatus",
    "JobDriveReport",
    "JobRunError",
    "JobValidationError",
    "JobConflictError",
    "StepReusedError",
    "cancel_job_run",
    "resume_job_run",
    "release_job_lease",
    "prune_job_runs",
    "job_run_health",
    "LeaseLostError",
    "run_worker",
    "PassObserver",
    "PassWatch",
    "observe_all",
    "LOG_PASSES",
    "pause_job_run",
    "unpause_job_run",
    "pause_job",
    "unpause_job",
    "pause_limit",
    "unpause_limit",
}


# Every public function's signature as it was before jobrun/_api.py bound the core
# functions to the real sources (issue 35): the refactor changed none of them.
PUBLIC_SIGNATURES = {
    "assert_queue_safe": "(value: 'Any', root: 'str') -> 'None'",
    "cancel_job_run": (
        "(store: 'OperatorStore', run_id: 'str', reason: 'str', *, "
        "clock: 'ClockLike | None' = None) -> 'JobRun'"
    ),
    "get_job_run": "(store: 'JobRunStore', run_id: 'str') -> 'JobRun | None'",
    "job_run_health": (
        "(store: 'OperatorStore', *, by_job: 'bool' = False, "
        "clock: 'ClockLike | None' = None) -> 'JobRunHealth'"
    ),
    "job_run_list_limit": "(limit: 'float | None') -> 'int'",
    "job_runs": (
        "(store: 'JobRunStore', *, module_id: 'str | None' = None, "
        "job: 'str | None' = None, instance: 'str | None' = None, "
        "status: 'str | None' = None, limit: 'float | None' = None) -> 'list[JobRun]'"
    ),
    "migrate_on_connection": (
        "(connection: 'Connection', revision: 'str' = 'head', *, "
        "schema: 'str | None' = None) -> 'None'"
    ),
    "observe_all": "(*observers: 'PassObserver') -> 'PassObserver'",
    # Pause and unpause (issue 34), added after the issue 35 refactor.
    "pause_job": (
        "(store: 'OperatorStore', *, module_id: 'str', job: 'str', "
        "reason: 'str | None' = None, clock: 'ClockLike | None' = None) -> 'int'"
    ),
    "pause_job_run": (
        "(store: 'OperatorStore', run_id: 'str', *, reason: 'str | None' = None, "
        "clock: 'ClockLike | None' = None) -> 'JobRun'"
    ),
    "pause_limit": (
        "(store: 'OperatorStore', key: 'str', *, reason: 'str | None' = None, "
        "clock: 'ClockLike | None' = None) -> 'bool'"
    ),
    "prune_job_runs": (
        "(store: 'OperatorStore', *, older_than: 'timedelta | datetime', "
        "statuses: 'tuple[str, ...]' = ('done',), batch_size: 'int' = 500, "
        "clock: 'ClockLike | None' = None, only_jobs: 'frozenset[tuple[str, "
        "str]] | None' = None, except_jobs: 'frozenset[tuple[str, "
        "str]]' = frozenset()) -> 'int'"
    ),
    "release_job_lease": "(store: 'OperatorStore', run_id: 'str') -> 'bool'",
    "resume_job_run": (
        "(store: 'OperatorStore', run_id: 'str', *, clock: 'ClockLike | None' = None) -> 'JobRun'"
    ),
    "run_due_jobs": (
        "(store: 'JobRunStore', registry: 'JobRegistry', *, "
        "options: 'DriveOptions | None' = None, stop: 'asyncio.Event | None' = None, "
        "**keywords: 'Unpack[DriveKeywords]') -> 'JobDriveReport'"
    ),
    "run_worker": (
        "(databases: 'Sequence[Database]', registry: 'JobRegistry', *, "
        "options: 'DriveOptions | None' = None, interval_s: 'float' = 5.0, "
        "concurrency: 'int' = 1, on_health: 'HealthCallback | None' = None, "
        "stop: 'asyncio.Event | None' = None, prune_after: 'timedelta | None' = None, "
        "prune_unregistered_after: 'timedelta | None' = None, "
        "schema: 'str | None' = None, max_open_sqlite: 'int' = 64, "
        "max_connections_per_database: 'int' = 2, max_databases: 'int | None' = None, "
        "reloads: 'asyncio.Queue[Sequence[Database]] | None' = None, "
        "heartbeat_s: 'float' = 10.0, **keywords: 'Unpack[DriveKeywords]') -> 'None'"
    ),
    "skip_jobrun_tables": (
        "(obj: 'object', name: 'str | None', type_: 'str', reflected: 'bool', "
        "compare_to: 'object') -> 'bool'"
    ),
    "start_job_run": (
        "(store: 'JobRunStore', *, module_id: 'str', job: 'str', "
        "instance: 'str' = 'default', payload: 'Any' = None, priority: 'int' = 0, "
        "start_at: 'datetime | None' = None, delay_s: 'float | None' = None, "
        "clock: 'ClockLike | None' = None, connection: 'Any' = None) -> 'JobRun'"
    ),
    "start_job_runs": (
        "(store: 'JobRunStore', starts: 'Iterable[JobStart]', *, "
        "clock: 'ClockLike | None' = None, connection: 'Any' = None) -> 'list[JobRun]'"
    ),
    "start_scheduled_runs": (
        "(store: 'ScheduleStore', registry: 'JobRegistry', *, "
        "now: 'datetime | None' = None, "
        "clock: 'ClockLike | None' = None) -> 'list[JobRun]'"
    ),
    "unpause_job": (
        "(store: 'OperatorStore', *, module_id: 'str', job: 'str', "
        "clock: 'ClockLike | None' = None) -> 'int'"
    ),
    "unpause_job_run": (
        "(store: 'OperatorStore', run_id: 'str', *, clock: 'ClockLike | None' = None) -> 'JobRun'"
    ),
    "unpause_limit": "(store: 'OperatorStore', key: 'str') -> 'int'",
    "upgrade": (
        "(engine: 'AsyncEngine', revision: 'str' = 'head', *, "
        "schema: 'str | None' = None) -> 'None'"
    ),
    "upgrade_many": (
        "(urls: 'Iterable[str | URL]', *, concurrency: 'int' = 8, "
        "schema: 'str | None' = None, "
        "revision: 'str' = 'head') -> 'list[UpgradeResult]'"
    ),
}


def isort_style_key(name: str) -> tuple[int, list[Any]]:
    """The order ruff's RUF022 keeps ``__all__`` in.

    SCREAMING_SNAKE_CASE first, then CamelCase, then everything else; a natural
    sort (digit runs compared as numbers) inside each group.
    """
    if len(name) > 1 and name.isupper():
        group = 0
    elif name[:1].isupper():
        group = 1
    else:
        group = 2
    natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    return group, natural


# --- __all__ ------------------------------------------------------------------------------


def test_the_sort_key_matches_ruff_on_known_orders() -> None:
    names = ["upgrade", "JobRun", "KEEP_CURSOR", "a2", "a10", "Job2", "Job10", "X"]
    assert sorted(names, key=isort_style_key) == [
        "KEEP_CURSOR",
        "Job2",
        "Job10",
        "JobRun",
        "X",
        "a2",
        "a10",
        "upgrade",
    ]


@pytest.mark.parametrize(
    "module", [jobrun, jobrun.errors, jobrun.testing], ids=lambda m: m.__name__
)
def test_all_is_sorted_the_way_ruff_sorts_it(module: Any) -> None:
    names = list(module.__all__)
    assert names == sorted(names, key=isort_style_key)
    assert len(set(names)) == len(names)


def test_every_name_in_all_exists() -> None:
    # getattr resolves the lazy names (the SQL layer and the worker) as a user's access would.
    missing = [name for name in jobrun.__all__ if getattr(jobrun, name, None) is None]
    assert missing == []


def test_every_public_attribute_is_in_all() -> None:
    public = {
        name
        for name in dir(jobrun)
        if not name.startswith("_") and not inspect.ismodule(getattr(jobrun, name))
    }
    assert public == set(jobrun.__all__)


def test_the_public_signatures_are_unchanged() -> None:
    functions = {name: getattr(jobrun, name) for name in jobrun.__all__}
    signatures = {
        name: str(inspect.signature(function))
        for name, function in functions.items()
        if inspect.isfunction(function)
    }
    assert signatures == PUBLIC_SIGNATURES


@pytest.mark.parametrize(
    "name",
    [
        "cancel_job_run",
        "job_run_health",
        "pause_job",
        "pause_job_run",
        "pause_limit",
        "prune_job_runs",
        "resume_job_run",
        "start_job_run",
        "start_job_runs",
        "start_scheduled_runs",
        "unpause_job",
        "unpause_job_run",
        "unpause_limit",
    ],
)
def test_an_operation_bound_to_the_real_sources_reads_as_its_own_function(name: str) -> None:
    function = getattr(jobrun, name)
    assert inspect.iscoroutinefunction(function)
    assert (function.__module__, function.__name__, function.__qualname__) == (
        "jobrun._api",
        name,
        name,
    )
    assert function.__doc__
    assert "sources" not in function.__annotations__


def test_a_lazy_name_is_the_object_its_module_defines() -> None:
    from jobrun.sql.store import SqlJobRunStore
    from jobrun.worker import run_worker

    assert jobrun.SqlJobRunStore is SqlJobRunStore
    assert jobrun.run_worker is run_worker


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'jobrun' has no attribute 'SqlJobStore'"):
        getattr(jobrun, "SqlJobStore")  # noqa: B009  (the misspelt name is the point)


def test_import_jobrun_and_its_testing_kit_load_neither_sqlalchemy_nor_alembic() -> None:
    # A fresh interpreter: this one imported both long ago. The SQL layer loads on first use.
    probe = (
        "import sys, jobrun, jobrun.testing\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'}))\n"
        "jobrun.SqlJobRunStore\n"
        "print('sqlalchemy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["[]", "True"]


def test_the_required_names_are_exported() -> None:
    assert set(jobrun.__all__) >= REQUIRED_NAMES


def test_every_error_is_exported() -> None:
    assert set(jobrun.errors.__all__) <= set(jobrun.__all__)
    for name in jobrun.errors.__all__:
        assert getattr(jobrun, name) is getattr(jobrun.errors, name)


def test_version() -> None:
    assert isinstance(jobrun.__version__, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", jobrun.__version__)


def test_the_testing_module_exports_the_doubles() -> None:
    assert set(jobrun.testing.__all__) >= {"FakeClock", "MemoryJobRunStore"}
    assert inspect.isclass(jobrun.testing.FakeClock)
    assert inspect.isclass(jobrun.testing.MemoryJobRunStore)
