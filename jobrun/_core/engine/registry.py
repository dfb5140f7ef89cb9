"""The host's table of job handlers, keyed by ``(module_id, name)``, and their schedules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from jobrun._core.engine.passes import Handler
from jobrun._core.leases.renewal import DEFAULT_LEASE_MS, DEFAULT_MAX_TAKEOVERS, check_lease_ms
from jobrun._core.limits.declarations import LimitDeclarations, concurrency_limit, rate_limit
from jobrun._core.model.names import require_name
from jobrun._core.model.refusals import checked_int, refuse, refuse_type, type_name
from jobrun._core.rules.retry import RetryPolicy
from jobrun._core.rules.schedules import Schedule, make_schedule
from jobrun._core.rules.transitions import DEFAULT_MAX_DEFERRALS
from jobrun._core.rules.versions import Upgrade, checked_upgrades, checked_version
from jobrun.errors import JobConflictError


@dataclass(frozen=True, slots=True)
class RegisteredJob:
    module_id: str
    name: str
    handler: Handler
    retry: RetryPolicy | None
    lease_ms: int = DEFAULT_LEASE_MS
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS
    max_concurrent: int | None = None
    keep_for: timedelta | None = None
    max_deferrals: int = DEFAULT_MAX_DEFERRALS
    # The code's version, and its upgrade functions in order (the first upgrades
    # a cursor of version 1); see jobrun._core.rules.versions.
    version: int = 1
    upgrades: tuple[Upgrade, ...] = ()


def _check_max_concurrent(value: object) -> int | None:
    if value is None:
        return None
    most = checked_int(value, "max_concurrent", wanted="an int or None")
    if most < 1:
        raise refuse("max_concurrent", f"must be at least 1, got {most}")
    return most


def _check_keep_for(value: object) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise refuse_type("keep_for", f"must be a timedelta or None, got {type_name(value)}")
    if value <= timedelta(0):
        raise refuse("keep_for", f"must be positive, got {value}")
    return value


def _checked_job(given: RegisteredJob, upgrade: object) -> RegisteredJob:
    """``given`` (as :meth:`JobRegistry.register` was called) once every option is
    checked, with its upgrade functions in order; refused otherwise."""
    module_id, name, handler = given.module_id, given.name, given.handler
    require_name(module_id, "module_id")
    require_name(name, "name")
    if not callable(handler):
        raise refuse_type(
            "handler",
            f"must be callable, got {type_name(handler)}",
            message=f"handler for {module_id}/{name} must be callable",
        )
    if given.retry is not None and not isinstance(given.retry, RetryPolicy):
        raise refuse_type("retry", f"must be a RetryPolicy, got {type_name(given.retry)}")
    check_lease_ms(given.lease_ms)
    if checked_int(given.max_takeovers, "max_takeovers") < 0:
        raise refuse("max_takeovers", f"must not be negative, got {given.max_takeovers}")
    if checked_int(given.max_deferrals, "max_deferrals") < 0:
        raise refuse("max_deferrals", f"must not be negative, got {given.max_deferrals}")
    return replace(
        given,
        max_concurrent=_check_max_concurrent(given.max_concurrent),
        keep_for=_check_keep_for(given.keep_for),
        upgrades=checked_upgrades(checked_version(given.version), upgrade),
    )


class JobRegistry:
    """Which handler runs which job, keyed by ``(module_id, name)``.

    A handler takes a :class:`JobPass` and returns a :class:`PassResult`; it may
    be a plain function or a coroutine function::

        registry = jobrun.JobRegistry()

        @registry.job("shop", "reindex", retry=jobrun.RetryPolicy(max_attempts=5))
        async def reindex(p: jobrun.JobPass) -> jobrun.PassResult:
            ...

    Drivers only claim runs of the jobs their registry holds. The pair is the
    key: ``("a/b", "c") != ("a", "b/c")``.
    """

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], RegisteredJob] = {}
        self._schedules: dict[tuple[str, str, str], Schedule] = {}
        self.limits = LimitDeclarations()
        """The rate and concurrency limits declared here, which steps name."""

    def register(
        self,
        module_id: str,
        name: str,
        handler: Handler,
        *,
        retry: RetryPolicy | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
        max_concurrent: int | None = None,
        keep_for: timedelta | None = None,
        max_deferrals: int = DEFAULT_MAX_DEFERRALS,
        version: int = 1,
        upgrade: Mapping[int, Upgrade] | None = None,
    ) -> None:
        """Register ``handler`` for a job; registering the same pair twice is an error.

        ``lease_ms`` is how long a driver holds a run of this job without renewing
        (at least 100 ms; renewals happen every quarter of it). After
        ``max_takeovers`` consecutive expired leases (drivers dying mid-pass) the
        run is failed rather than handed to yet another driver.
        ``max_concurrent`` caps how many runs of this job hold a lease at once,
        across every driver of a database (the claim enforces it).
        ``keep_for`` is how long the worker keeps this job's finished runs
        (instead of its ``prune_after``, if any).
        ``max_deferrals`` is how many passes in a row a run may end by raising
        :class:`~jobrun.RetryAfter` (an int of at least 0, default 100); the
        one after that fails the run, saying so in ``last_error``.

        ``version`` is the version of this code of the job (an int, at least 1),
        to be raised when a run's stored cursor or ledger no longer fits the
        code; ``upgrade`` then maps each older version to a plain synchronous
        function taking a cursor of that version and returning one of the next
        (``{1: from_1, 2: from_2}`` for version 3). A driver never claims a run
        whose code was newer than its own; a pass of newer code upgrades the
        stored cursor through each function in order first, and the steps the
        older code recorded do not answer the new code's (see
        docs/how-to/change-a-job.md).
        """
        given = RegisteredJob(
            module_id,
            name,
            handler,
            retry,
            lease_ms,
            max_takeovers,
            max_concurrent,
            keep_for,
            max_deferrals,
            version,
        )
        job = _checked_job(given, upgrade)
        key = (module_id, name)
        if key in self._jobs:
            raise JobConflictError(
                f"job {name!r} of module {module_id!r} is already registered",
                "job_already_registered",
            )
        self._jobs[key] = job

    def job(
        self,
        module_id: str,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
        max_concurrent: int | None = None,
        keep_for: timedelta | None = None,
        max_deferrals: int = DEFAULT_MAX_DEFERRALS,
        version: int = 1,
        upgrade: Mapping[int, Upgrade] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`; returns the function unchanged."""

        def decorate(handler: Handler) -> Handler:
            self.register(
                module_id,
                name,
                handler,
                retry=retry,
                lease_ms=lease_ms,
                max_takeovers=max_takeovers,
                max_concurrent=max_concurrent,
                keep_for=keep_for,
                max_deferrals=max_deferrals,
                version=version,
                upgrade=upgrade,
            )
            return handler

        return decorate

    def schedule(
        self,
        module_id: str,
        job: str,
        cron: str,
        *,
        payload: Any = None,
        catch_up: str = "latest",
        instance: str | None = None,
        priority: int = 0,
    ) -> None:
        """Start a run of the job at every instant ``cron`` names (UTC), once per instant.

        ``cron`` is in croniter's syntax: five fields, or six with seconds as the
        sixth (``"* * * * * */10"`` is every ten seconds). Each slot's run has the
        slot's instant as its instance (``2026-01-01T00:00:10.000Z``), unless
        ``instance`` is given: then every slot's run has that instance, and a slot
        that comes while the previous slot's run is still live joins it.

        ``catch_up`` says what happens to slots missed while no worker was
        looking: ``"latest"`` starts the most recent of them only, ``"all"``
        starts every one of them (at most the newest 100), ``"none"`` none (the
        next slot starts on time). The job may be registered before or after;
        the same job and instance cannot be scheduled twice.
        """
        made = make_schedule(module_id, job, cron, payload, catch_up, instance, priority)
        if made.key in self._schedules:
            which = "each slot's own instance" if instance is None else f"instance {instance!r}"
            raise JobConflictError(
                f"job {job!r} of module {module_id!r} already has a schedule for {which}",
                "schedule_already_registered",
            )
        self._schedules[made.key] = made

    def rate_limit(
        self, key: str, *, per_second: float, burst: int = 1, store: object = None
    ) -> None:
        """Declare rate limit ``key``: step bodies that name it (``p.step(...,
        rate_limit=key)``) start at most ``per_second`` a second, ``burst`` at once
        after a lull, counted across every driver on every host.

        The bucket is a row in a database, refilled on that database's clock: by
        default the database of the run being driven; ``store`` (a store, e.g.
        ``SqlJobRunStore`` on one shared database) names where it lives, for a limit
        shared by runs kept in many databases (one per scope). Declaring the same
        key again with the same rate is accepted; with another rate it is refused.
        """
        self.limits.declare_rate(rate_limit(key, per_second, burst, store))

    def concurrency_limit(self, prefix: str, most: int) -> None:
        """Declare that at most ``most`` step bodies run at once under each key that
        starts with ``prefix`` (``p.step(..., concurrency_limit=f"tenant-{tid}")``),
        across every driver on every host; the longest declared prefix of a key is
        the one that applies. The same prefix with another ``most`` is refused.
        """
        self.limits.declare_concurrency(concurrency_limit(prefix, most))

    def schedules(self) -> list[Schedule]:
        """Every schedule, in the order they were added."""
        return list(self._schedules.values())

    def get(self, module_id: str, name: str) -> RegisteredJob | None:
        """The registration of a job (handler, retry, lease), or ``None`` if unknown."""
        return self._jobs.get((module_id, name))

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[RegisteredJob]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)
