"""The host's table of job handlers, keyed by ``(module_id, name)``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jobrun._core.lease import DEFAULT_LEASE_MS, DEFAULT_MAX_TAKEOVERS, check_lease_ms
from jobrun._core.names import require_name
from jobrun._core.passes import Handler
from jobrun._core.retry import RetryPolicy
from jobrun.errors import JobConflictError


@dataclass(frozen=True, slots=True)
class RegisteredJob:
    module_id: str
    name: str
    handler: Handler
    retry: RetryPolicy | None
    lease_ms: int = DEFAULT_LEASE_MS
    max_takeovers: int = DEFAULT_MAX_TAKEOVERS


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

    def register(
        self,
        module_id: str,
        name: str,
        handler: Handler,
        *,
        retry: RetryPolicy | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
    ) -> None:
        """Register ``handler`` for a job; registering the same pair twice is an error.

        ``lease_ms`` is how long a driver holds a run of this job without renewing
        (at least 100 ms; renewals happen every quarter of it). After
        ``max_takeovers`` consecutive expired leases (drivers dying mid-pass) the
        run is failed rather than handed to yet another driver.
        """
        require_name(module_id, "module_id")
        require_name(name, "name")
        if not callable(handler):
            raise TypeError(f"handler for {module_id}/{name} must be callable")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
        check_lease_ms(lease_ms)
        if isinstance(max_takeovers, bool) or not isinstance(max_takeovers, int):
            raise TypeError(f"max_takeovers must be an int, got {type(max_takeovers).__name__}")
        if max_takeovers < 0:
            raise ValueError(f"max_takeovers must not be negative, got {max_takeovers}")
        key = (module_id, name)
        if key in self._jobs:
            raise JobConflictError(
                f"job {name!r} of module {module_id!r} is already registered",
                "job_already_registered",
            )
        self._jobs[key] = RegisteredJob(module_id, name, handler, retry, lease_ms, max_takeovers)

    def job(
        self,
        module_id: str,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_takeovers: int = DEFAULT_MAX_TAKEOVERS,
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
            )
            return handler

        return decorate

    def get(self, module_id: str, name: str) -> RegisteredJob | None:
        """The registration of a job (handler, retry, lease), or ``None`` if unknown."""
        return self._jobs.get((module_id, name))

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[RegisteredJob]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)
