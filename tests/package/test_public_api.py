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
