"""Retry policies and backoff."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobrun._core.model.formats import add_milliseconds
from jobrun._core.model.refusals import checked_int, refuse


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a pass (or one step) is tried and how long to wait between tries.

    ``max_attempts`` counts every attempt including the first; reaching it fails
    the run. The wait before attempt ``n + 1`` is
    ``min(base_delay_ms * 2 ** (n - 1), max_delay_ms)`` times a jitter in
    [0.8, 1.2] (reaching 1.2 only by float rounding); a zero wait is never
    jittered, so ``base_delay_ms=0`` retries in the same instant (which tests
    rely on).
    """

    max_attempts: int = 5
    base_delay_ms: int = 1000
    max_delay_ms: int = 300_000

    def __post_init__(self) -> None:
        for name, lowest in (("max_attempts", 1), ("base_delay_ms", 0), ("max_delay_ms", 0)):
            value = checked_int(getattr(self, name), name, subject=f"RetryPolicy.{name}")
            if value < lowest:
                problem = f"must be at least {lowest}, got {value}"
                raise refuse(name, problem, message=f"RetryPolicy.{name} {problem}")

    def delay_ms(self, attempts: int, random: Callable[[], float]) -> float:
        """The wait after the ``attempts``-th consecutive failure (jitter after the cap)."""
        raw: int = min(self.base_delay_ms * 2 ** max(attempts - 1, 0), self.max_delay_ms)
        if raw == 0:
            return 0
        return raw * (0.8 + random() * 0.4)

    def next_attempt_at(self, attempts: int, failed_at: str, random: Callable[[], float]) -> str:
        """When the run is due again: ``failed_at`` (stored timestamp text) plus the delay."""
        return add_milliseconds(failed_at, self.delay_ms(attempts, random))


DEFAULT_RETRY = RetryPolicy()
