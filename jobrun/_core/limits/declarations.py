"""Rate and concurrency limits: their declarations, and the arithmetic of a token bucket.

Declared once on the registry (``registry.rate_limit``, ``registry.concurrency_limit``)
and named by steps (``p.step(..., rate_limit=..., concurrency_limit=...)``). The
state they count lives in a database, so every driver on every host shares it;
this module only decides (``jobrun._core.engine.limit_gate`` waits and asks the store).

A rate limit is a token bucket of ``burst`` tokens refilled at ``per_second``.
Tokens are counted in whole thousandths (milli-tokens, an integer column), and a
take *reserves* the next token: the count may go below zero, each thousand below
zero being one taker already promised a token that has not refilled yet, which
it waits for. So one take is one write (no polling), takers are served in the
order they asked, and what the database holds says who is waiting.

Declared at an API's own rate and burst, jobrun keeps part of the burst back
(:func:`spent_at_once`): a request reaches the API a little after its token, by
a delay that varies (the scheduler, the network, another process's stall), and
only an allowance the API still has can absorb requests that arrive closer
together than their tokens were. A token whose body is released later than
that allowance covers (:func:`stale_after_s`) is not used: its turn has passed,
and a new one is reserved.

A concurrency limit covers every key that starts with its prefix (the longest
declared prefix that matches wins) and bounds the step bodies in flight under
one key, across every driver.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobrun._core.limits.buckets import MILLI, spent_at_once
from jobrun._core.model.names import name_problem, shown_name
from jobrun._core.model.refusals import (
    checked_count,
    checked_number,
    checked_str,
    mistake,
    refuse,
)
from jobrun._core.time.clock import Clock
from jobrun.errors import JobConflictError


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``per_second`` step bodies a second under ``key``, ``burst`` at once after a lull.

    ``store`` is where the bucket lives (``None``: the store of the run being driven).
    """

    key: str
    per_second: float
    burst: int
    store: object | None = field(default=None, compare=False)

    def same_rate(self, other: RateLimit) -> bool:
        return (self.per_second, self.burst, self.store) == (
            other.per_second,
            other.burst,
            other.store,
        )


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most ``most`` step bodies in flight at once under each key starting with ``prefix``."""

    prefix: str
    most: int


@dataclass(frozen=True, slots=True)
class StepLimits:
    """What one step waits for before its body runs: a token, a slot, both or neither."""

    rate: RateLimit | None = None
    concurrency_key: str | None = None
    concurrency: ConcurrencyLimit | None = None

    @property
    def any(self) -> bool:
        return self.rate is not None or self.concurrency is not None


NO_LIMITS = StepLimits()


def _checked_key(value: object, path: str) -> str:
    key = checked_str(value, path)
    problem = name_problem(key)
    if problem is not None:
        raise refuse(path, problem, message=f"{path} {shown_name(key)} {problem}")
    return key


def rate_limit(key: object, per_second: object, burst: object, store: object) -> RateLimit:
    """A checked :class:`RateLimit`: ``per_second`` a positive finite number (not a
    bool), ``burst`` an int of at least 1, ``key`` a name."""
    name = _checked_key(key, "key")
    rate = checked_number(per_second, "per_second", wanted="a number", show_value=True)
    if not (rate > 0 and math.isfinite(rate)):
        raise refuse("per_second", f"must be a positive, finite number, got {per_second!r}")
    most = checked_count(burst, "burst")
    if most * MILLI > 2**31 - 1 - MILLI:
        # The bucket is an INTEGER column of milli-tokens (32 bits on Postgres).
        raise refuse("burst", f"must be at most {2**31 // MILLI - 2}, got {most}")
    return RateLimit(name, float(rate), most, store)


def concurrency_limit(prefix: object, most: object) -> ConcurrencyLimit:
    """A checked :class:`ConcurrencyLimit`: ``prefix`` a non-empty name, ``most`` at least 1."""
    return ConcurrencyLimit(_checked_key(prefix, "prefix"), checked_count(most, "most"))


class SlotWakeups:
    """Steps of this process waiting for a slot, by key: woken when a step of this
    process lets go of one (slots freed elsewhere are found by polling)."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}

    async def wait(self, key: str, seconds: float, clock: Clock) -> None:
        """Return after ``seconds`` on ``clock``, or sooner when ``key`` is woken."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, set())
        waiting.add(woken)
        try:
            async with clock.timeout(seconds):
                await woken
        except TimeoutError:
            pass
        finally:
            waiting.discard(woken)
            if not waiting:
                self._waiting.pop(key, None)

    def wake(self, key: str) -> None:
        for woken in self._waiting.get(key, ()):
            if not woken.done() and not woken.get_loop().is_closed():
                woken.set_result(None)


class Pacer:
    """This process's own spacing of one rate limit's step bodies.

    The database grants tokens at the right instants, but a process that was not
    scheduled for a while (a loaded host, a long garbage collection) wakes with
    every granted wait over at once and would send them all together: more than
    ``burst`` at once, which an API that counts as strictly refuses. So after its
    token, a body also takes one from a bucket of the same rate and burst kept in
    this process on its monotonic clock: at most :func:`spent_at_once` start at
    once, the rest one per ``1 / per_second``. In steady state the database's spacing is already
    this, and nothing waits here.
    """

    def __init__(self, per_second: float, burst: int) -> None:
        self._interval_s = 1.0 / per_second
        self._burst = float(spent_at_once(burst))
        self._tokens = self._burst
        self._at_s: float | None = None

    def delay_s(self, now_s: float) -> float:
        """Reserve the next local start; the seconds to wait for it (0: start now)."""
        if self._at_s is not None:
            refill = max(0.0, now_s - self._at_s) / self._interval_s
            self._tokens = min(self._burst, self._tokens + refill)
        self._at_s = now_s
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens * self._interval_s


class LimitDeclarations:
    """The limits one registry declares; the same declaration twice is accepted,
    a different one for the same key (or prefix) is refused."""

    def __init__(self) -> None:
        self._rates: dict[str, RateLimit] = {}
        self._prefixes: dict[str, ConcurrencyLimit] = {}
        self.wakeups = SlotWakeups()
        self._pacers: dict[str, Pacer] = {}

    def pacer(self, rate: RateLimit) -> Pacer:
        """This process's pacer for ``rate`` (one per key, shared by every pass)."""
        found = self._pacers.get(rate.key)
        if found is None:
            found = self._pacers[rate.key] = Pacer(rate.per_second, rate.burst)
        return found

    def declare_rate(self, declared: RateLimit) -> None:
        known = self._rates.get(declared.key)
        if known is not None and not known.same_rate(declared):
            raise JobConflictError(
                f"rate limit {declared.key!r} is already declared as "
                f"{known.per_second:g}/s, burst {known.burst} (and its store); "
                f"one key has one rate",
                "limit_already_declared",
            )
        self._rates[declared.key] = declared

    def declare_concurrency(self, declared: ConcurrencyLimit) -> None:
        known = self._prefixes.get(declared.prefix)
        if known is not None and known != declared:
            raise JobConflictError(
                f"concurrency limit {declared.prefix!r} is already declared as "
                f"{known.most}; one prefix has one limit",
                "limit_already_declared",
            )
        self._prefixes[declared.prefix] = declared

    @property
    def rates(self) -> Mapping[str, RateLimit]:
        return dict(self._rates)

    @property
    def prefixes(self) -> Mapping[str, ConcurrencyLimit]:
        return dict(self._prefixes)

    def for_step(self, step: str, rate_key: object, concurrency_key: object) -> StepLimits:
        """The limits a step named ``step`` asked for; a key nobody declared, or a
        key that is not a str, is a mistake in the handler's code."""
        if rate_key is None and concurrency_key is None:
            return NO_LIMITS
        rate = None if rate_key is None else self._rate_of(step, rate_key)
        if concurrency_key is None:
            return StepLimits(rate)
        key = _step_key(step, concurrency_key, "concurrency_limit")
        return StepLimits(rate, key, self._prefix_of(step, key))

    def _rate_of(self, step: str, rate_key: object) -> RateLimit:
        key = _step_key(step, rate_key, "rate_limit")
        found = self._rates.get(key)
        if found is None:
            raise mistake(
                "rate_limit",
                f"step {step!r}: rate_limit={key!r} is not declared; declare it once with "
                f"registry.rate_limit({key!r}, per_second=..., burst=...)",
            )
        return found

    def _prefix_of(self, step: str, key: str) -> ConcurrencyLimit:
        found = matching_prefix(self._prefixes, key)
        if found is None:
            raise mistake(
                "concurrency_limit",
                f"step {step!r}: concurrency_limit={key!r} matches no declared prefix; "
                "declare one with registry.concurrency_limit(prefix, most)",
            )
        return found


def _step_key(step: str, value: object, path: str) -> str:
    if not isinstance(value, str):
        raise mistake(path, f"step {step!r}: {path} must be a str, got {type(value).__name__}")
    problem = name_problem(value)
    if problem is not None:
        raise mistake(path, f"step {step!r}: {path} {shown_name(value)} {problem}")
    return value


def matching_prefix(prefixes: Mapping[str, ConcurrencyLimit], key: str) -> ConcurrencyLimit | None:
    """The declaration with the longest prefix of ``key``, or ``None``."""
    for length in range(len(key), 0, -1):
        found = prefixes.get(key[:length])
        if found is not None:
            return found
    return None
