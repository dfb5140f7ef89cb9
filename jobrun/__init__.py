"""jobrun: long, resumable, coalesced work for asyncio, on SQLite and Postgres.

A *run* is one durable row per (module, job, instance); a *pass* is one call of
the job's handler, handing a *cursor* forward; a *step* inside a pass commits
its result as it completes so that it never runs again.
"""

import importlib
import typing

from jobrun._api import (
    cancel_job_run,
    job_run_health,
    pause_job,
    pause_job_run,
    pause_limit,
    prune_job_runs,
    resume_job_run,
    run_due_jobs,
    start_job_run,
    start_job_runs,
    start_scheduled_runs,
    unpause_job,
    unpause_job_run,
    unpause_limit,
)
from jobrun._core import (
    KEEP_CURSOR,
    LOG_PASSES,
    DriveError,
    DriveOptions,
    JobDriveReport,
    JobPass,
    JobRegistry,
    JobRun,
    JobRunHealth,
    JobRunStatus,
    JobRunStore,
    JobStart,
    LoggingObserver,
    OperatorStore,
    PassEnd,
    PassObserver,
    PassResult,
    PassStart,
    PassWatch,
    PauseRecord,
    RateLimitBucket,
    RetryPolicy,
    RunKey,
    ScheduleStore,
    StepEnd,
    StoreLimits,
    assert_queue_safe,
    get_job_run,
    job_run_list_limit,
    job_runs,
    observe_all,
    release_job_lease,
)
from jobrun._version import __version__ as __version__
from jobrun.errors import (
    ArgumentTypeError,
    CodeOutdatedError,
    HandlerMistakeError,
    JobConflictError,
    JobRunError,
    JobRunNotFoundError,
    JobRunNotLiveError,
    JobRunPausedError,
    JobValidationError,
    LeaseLostError,
    PassTimeoutError,
    RetryAfter,
    SchemaOutdatedError,
    StepFailedError,
    StepReusedError,
    StepTimeoutError,
    StoreError,
)

if typing.TYPE_CHECKING:  # what the lazy names below are, for type checkers, IDEs and griffe
    from jobrun.sql.executor import StatementHook
    from jobrun.sql.store import SqlJobRunStore
    from jobrun.sql.upgrades.host_alembic import migrate_on_connection, skip_jobrun_tables
    from jobrun.sql.upgrades.migrate import upgrade
    from jobrun.sql.upgrades.provisioning import UpgradeResult, upgrade_many
    from jobrun.worker import run_worker

# The SQL layer and the worker import SQLAlchemy and its dialects, which cost more
# than all of the rest; they load on first use (PEP 562) so that `import jobrun`
# (a host that only registers jobs, a CLI asking for --help) stays cheap.
_LAZY: dict[str, str] = {
    "StatementHook": "jobrun.sql.executor",
    "SqlJobRunStore": "jobrun.sql.store",
    "UpgradeResult": "jobrun.sql.upgrades.provisioning",
    "migrate_on_connection": "jobrun.sql.upgrades.host_alembic",
    "run_worker": "jobrun.worker",
    "skip_jobrun_tables": "jobrun.sql.upgrades.host_alembic",
    "upgrade": "jobrun.sql.upgrades.migrate",
    "upgrade_many": "jobrun.sql.upgrades.provisioning",
}


def _lazy_attribute(name: str) -> typing.Any:
    """The lazy public name ``name``, imported on first use and kept as a module global."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'jobrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later look-ups find the global and skip this function
    return value


def _names() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if not typing.TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error
    __getattr__ = _lazy_attribute
    __dir__ = _names


__all__ = [
    "KEEP_CURSOR",
    "LOG_PASSES",
    "ArgumentTypeError",
    "CodeOutdatedError",
    "DriveError",
    "DriveOptions",
    "HandlerMistakeError",
    "JobConflictError",
    "JobDriveReport",
    "JobPass",
    "JobRegistry",
    "JobRun",
    "JobRunError",
    "JobRunHealth",
    "JobRunNotFoundError",
    "JobRunNotLiveError",
    "JobRunPausedError",
    "JobRunStatus",
    "JobRunStore",
    "JobStart",
    "JobValidationError",
    "LeaseLostError",
    "LoggingObserver",
    "OperatorStore",
    "PassEnd",
    "PassObserver",
    "PassResult",
    "PassStart",
    "PassTimeoutError",
    "PassWatch",
    "PauseRecord",
    "RateLimitBucket",
    "RetryAfter",
    "RetryPolicy",
    "RunKey",
    "ScheduleStore",
    "SchemaOutdatedError",
    "SqlJobRunStore",
    "StatementHook",
    "StepEnd",
    "StepFailedError",
    "StepReusedError",
    "StepTimeoutError",
    "StoreError",
    "StoreLimits",
    "UpgradeResult",
    "assert_queue_safe",
    "cancel_job_run",
    "get_job_run",
    "job_run_health",
    "job_run_list_limit",
    "job_runs",
    "migrate_on_connection",
    "observe_all",
    "pause_job",
    "pause_job_run",
    "pause_limit",
    "prune_job_runs",
    "release_job_lease",
    "resume_job_run",
    "run_due_jobs",
    "run_worker",
    "skip_jobrun_tables",
    "start_job_run",
    "start_job_runs",
    "start_scheduled_runs",
    "unpause_job",
    "unpause_job_run",
    "unpause_limit",
    "upgrade",
    "upgrade_many",
]
