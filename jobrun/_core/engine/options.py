"""How a drive runs: one frozen, validated set of options for the driver, the worker and the CLI.

Every value is judged here, once, when the options are made; the driver, the
worker and ``jobrun worker`` hand the object on and never check it again. A bad
value is a :class:`jobrun.JobValidationError` whose entry names the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypedDict

from jobrun._core.engine.observe import PassObserver
from jobrun._core.engine.passes import OpenScope
from jobrun._core.model.refusals import (
    checked_bool,
    checked_callable,
    checked_count,
    checked_int,
    checked_seconds,
    checked_str,
    refuse_type,
)
from jobrun._core.time.clock import Clock, ClockLike

JOB_DRIVE_LIMIT = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveOptions:
    """How :func:`jobrun.run_due_jobs` drives, checked once when made.

    * ``limit``: runs one call claims at most (an ``int``, at least 1).
    * ``max_passes``: passes a claimed run gets before it goes back in line (an
      ``int``; below 1 counts as 1).
    * ``pass_timeout_s``: seconds a pass may take before it fails and is retried
      (``None``: no budget).
    * ``open_scope``: ``open_scope(run)`` gives what ``await p.scope()`` returns,
      sync or async (default: the store's engine).
    * ``driver_name``: how leases name this driver (default: host and process).
    * ``observer``: hears each pass and step (default: ``jobrun.LOG_PASSES``).
    * ``clock``: the time runs are judged by (default: the system clock, aligned
      to the database's).
    * ``random``: the source of retry jitter, returning floats in [0, 1)
      (default ``None``: the system's).
    * ``watchdog``: end the process (SIGKILL) when a step body that cannot be
      cancelled (a blocking call, a process woken from SIGSTOP) is still running
      when its run may be taken over, rather than let it overlap the next
      holder's. ``None`` (the default): on in :func:`jobrun.run_worker` and
      ``jobrun worker``, whose processes jobrun owns; off in
      :func:`jobrun.run_due_jobs`, which runs inside a host's own process (pass
      ``True`` there to have it). It watches real time only: with a test clock
      it does nothing.

    :func:`jobrun.run_due_jobs` and :func:`jobrun.run_worker` take one as
    ``options=`` or build one from the same names given as keywords. A bad
    value raises :class:`jobrun.JobValidationError` naming the field; nothing
    has been read or written by then.
    """

    limit: int = JOB_DRIVE_LIMIT
    max_passes: int = 1
    pass_timeout_s: float | None = None
    open_scope: OpenScope | None = None
    driver_name: str | None = None
    observer: PassObserver | None = None
    clock: ClockLike | None = None
    random: Callable[[], float] | None = None
    watchdog: bool | None = None

    def __post_init__(self) -> None:
        checked_count(self.limit, "limit")
        # The contract's rule: fewer than one pass per claim means one.
        max_passes = checked_int(self.max_passes, "max_passes", show_value=True)
        object.__setattr__(self, "max_passes", max(1, max_passes))
        if self.pass_timeout_s is not None:
            seconds = checked_seconds(self.pass_timeout_s, "pass_timeout_s")
            object.__setattr__(self, "pass_timeout_s", seconds)
        checked_callable(self.open_scope, "open_scope", "callable with the run")
        if self.driver_name is not None:
            checked_str(self.driver_name, "driver_name")
        if self.observer is not None and not callable(getattr(self.observer, "pass_started", None)):
            raise refuse_type(
                "observer", f"must be a PassObserver, got {type(self.observer).__name__}"
            )
        if not (self.clock is None or isinstance(self.clock, Clock) or callable(self.clock)):
            wanted = "a Clock or a callable returning a datetime"
            raise refuse_type("clock", f"must be {wanted}, got {type(self.clock).__name__}")
        checked_callable(self.random, "random", "callable returning a float")
        if self.watchdog is not None:
            checked_bool(self.watchdog, "watchdog")


class DriveKeywords(TypedDict, total=False):
    """The fields of :class:`DriveOptions`, as keyword arguments of the drivers."""

    limit: int
    max_passes: int
    pass_timeout_s: float | None
    open_scope: OpenScope | None
    driver_name: str | None
    observer: PassObserver | None
    clock: ClockLike | None
    random: Callable[[], float] | None
    watchdog: bool | None


def drive_options(options: DriveOptions | None, keywords: DriveKeywords) -> DriveOptions:
    """``options`` (default: the defaults) with the fields given as keywords replaced."""
    if options is None:
        return DriveOptions(**keywords)
    if not isinstance(options, DriveOptions):
        raise refuse_type("options", f"must be a DriveOptions, got {type(options).__name__}")
    return replace(options, **keywords) if keywords else options
