"""The public operations, bound once to the real sources.

``jobrun._core`` reads no real source (no clock, entropy, ``/proc`` or process
id; import-linter checks it). The core functions that need the machine take a
:class:`~jobrun._core.sources.Sources` as their first argument, and carry the
public signature and docstring after it. The public function is the core
function bound here to :data:`SYSTEM_SOURCES` (the system clock, the process's
id minter, its identity and view of other processes, the watchdog, its default
driver name and the system's random numbers, all from ``jobrun._host.system`` and
``jobrun._host.watchdog``), so each signature is written once; the worker hands the
same sources to the core it drives.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from jobrun._core import (
    DriveKeywords,
    DriveOptions,
    JobDriveReport,
    JobRegistry,
    JobRunStore,
    Sources,
    actions,
    drive,
    drive_options,
    pausing,
    runs,
    scheduled_runs,
    starts,
)
from jobrun._host import (
    SYSTEM_CLOCK,
    THIS_HOST,
    default_driver_name,
    mint_run_id,
    real_time_guard,
    system_random,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

Parameters = ParamSpec("Parameters")
Result = TypeVar("Result")

SYSTEM_SOURCES = Sources(
    clock=SYSTEM_CLOCK,
    mint_id=mint_run_id,
    random=system_random,
    host=THIS_HOST,
    driver_name=default_driver_name,
    guard=real_time_guard,
)
"""The machine this process runs on, as every public entry point hands it to the core."""


def with_system_sources(
    core: Callable[Concatenate[Sources, Parameters], Coroutine[Any, Any, Result]],
) -> Callable[Parameters, Coroutine[Any, Any, Result]]:
    """``core`` handed :data:`SYSTEM_SOURCES`: its name, docstring and signature
    without the first parameter, for ``help()``, ``inspect`` and the reference site
    (whose griffe extension, ``docs/_extensions/system_bound.py``, reads this call)."""

    @functools.wraps(core)
    async def bound(*arguments: Parameters.args, **keywords: Parameters.kwargs) -> Result:
        return await core(SYSTEM_SOURCES, *arguments, **keywords)

    signature = inspect.signature(core)
    first = next(iter(signature.parameters))
    # inspect.signature reads __signature__ before following __wrapped__ to core; set
    # through vars() since type checkers know no such attribute on a function.
    vars(bound)["__signature__"] = signature.replace(
        parameters=list(signature.parameters.values())[1:]
    )
    bound.__annotations__ = {
        name: annotation for name, annotation in core.__annotations__.items() if name != first
    }
    bound.__module__ = __name__
    return bound


start_job_run = with_system_sources(runs.start_job_run)
start_job_runs = with_system_sources(starts.start_job_runs)
start_scheduled_runs = with_system_sources(scheduled_runs.start_scheduled_runs)
cancel_job_run = with_system_sources(actions.cancel_job_run)
resume_job_run = with_system_sources(actions.resume_job_run)
job_run_health = with_system_sources(actions.job_run_health)
prune_job_runs = with_system_sources(actions.prune_job_runs)
pause_job_run = with_system_sources(pausing.pause_job_run)
unpause_job_run = with_system_sources(pausing.unpause_job_run)
pause_job = with_system_sources(pausing.pause_job)
unpause_job = with_system_sources(pausing.unpause_job)
pause_limit = with_system_sources(pausing.pause_limit)
unpause_limit = with_system_sources(pausing.unpause_limit)


async def run_due_jobs(
    store: JobRunStore,
    registry: JobRegistry,
    *,
    options: DriveOptions | None = None,
    stop: asyncio.Event | None = None,
    **keywords: Unpack[DriveKeywords],
) -> JobDriveReport:
    """Advance up to ``limit`` due runs of registered jobs by up to ``max_passes`` passes each.

    This is the bounded driver: it returns when nothing registered is due or the
    bounds are reached, so the host calls it again, from a loop, a timer or a
    scheduler tick (:func:`run_worker` is such a loop). A run that is backing off
    after a failure is not due until its ``next_attempt_at``.

    How it drives (``limit``, ``max_passes``, ``pass_timeout_s``, ``open_scope``,
    ``driver_name``, ``observer``, ``clock``, ``random``) is a
    :class:`jobrun.DriveOptions`: pass one as ``options``, or its fields as
    keywords (``run_due_jobs(store, registry, max_passes=10)``); keywords given
    with ``options`` replace those fields. A bad value raises
    :class:`jobrun.JobValidationError` before anything is read.

    Runs are leased one at a time, in the order they became due, so any number of
    drivers may share a database: each run is driven by one of them at a time.
    A run's failure is recorded on the run and reported, never raised, whatever
    the handler raised; only the store's own failures (a lost database) escape,
    and a write that would have released a lease then is sent again before the
    next claim on the same store, so the run need not wait for its lease to
    expire. A ``KeyboardInterrupt`` or ``SystemExit`` raised inside a handler or
    step (``sys.exit()``) is recorded as that run's failed attempt, releasing its
    lease, and then raised again, so it still stops the program. When ``stop`` is
    set, no new run is claimed and the run in hand gets no further pass.

    ``observer`` hears each pass and its steps (see ``jobrun.PassObserver``); by
    default they are logged on the ``jobrun.pass`` and ``jobrun.step`` loggers.
    """
    chosen = drive_options(options, keywords)
    return await drive.drive_due_jobs(store, registry, chosen, SYSTEM_SOURCES, stop=stop)
