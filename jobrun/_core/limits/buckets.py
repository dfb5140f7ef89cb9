"""The arithmetic of a rate limit's token bucket, and what a database's limits hold.

Tokens are counted in whole thousandths (:data:`MILLI`), and a take reserves the
next token (see :mod:`jobrun._core.limits.declarations` for why). Pure numbers:
the store runs the same rules in SQL, and the rule-parity tests hold the two together.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobrun._core.model.records import RateLimitBucket
from jobrun.errors import RetryAfter

MILLI = 1000
"""Milli-tokens in one token."""


# -- the token bucket ---------------------------------------------------------------------


def spent_at_once(burst: int) -> int:
    """Tokens the bucket of a limit declared with ``burst`` holds at most: half of
    it, rounded up. The other half is the API's allowance kept for the jitter
    between a token and its request's arrival (see :func:`stale_after_s`).

    Declared at an API's own burst ``b`` (``b`` at once after a lull), jobrun
    sends at most ``b - b // 2`` at once; requests that arrive up to
    ``(b // 2) / per_second`` later than their tokens' instants, while the others
    arrive on time, then still fit what the API allows. Only the first moments
    after a lull are slower; the rate is the declared one.
    """
    return burst - burst // 2


def bucket_cap_milli(burst: int) -> int:
    """The bucket's milli-tokens at most (:func:`spent_at_once` tokens)."""
    return spent_at_once(burst) * MILLI


def stale_after_s(per_second: float, burst: int) -> float:
    """How late after its instant a token may still be used: half of the allowance
    kept back (``burst // 2`` tokens' worth of time, at least one), the other half
    left for the time between the body's release and its request reaching the API.

    A body released later than that (a process that was not scheduled, a stall)
    is not sent on that token, whose turn has passed and whose neighbours went out
    on time, but reserves another (once: see ``limit_gate``).
    """
    return max(burst // 2, 1) / 2 / per_second


def refilled(tokens_milli: int, elapsed_ms: float, per_second: float, burst: int) -> int:
    """The bucket's milli-tokens ``elapsed_ms`` after it held ``tokens_milli``.

    ``per_second`` tokens a second is ``per_second`` milli-tokens a millisecond;
    only whole milli-tokens are added (the fraction is dropped, so the bucket errs
    towards fewer tokens, never more), up to :func:`bucket_cap_milli`. Time that runs
    backwards adds nothing. The SQL store computes the same in its take statement.
    """
    gained = math.floor(max(0.0, elapsed_ms) * per_second)
    return int(min(bucket_cap_milli(burst), tokens_milli + gained))


def wait_for_token_s(tokens_milli: int, per_second: float) -> float:
    """Seconds until a taker whose take left ``tokens_milli`` holds its token: none
    while the count is at or above zero, else until it refills to zero."""
    if tokens_milli >= 0:
        return 0.0
    return -tokens_milli / (per_second * MILLI)


def take(tokens_milli: int, elapsed_ms: float, per_second: float, burst: int) -> tuple[int, float]:
    """Reserve one token: the bucket after the take, and the seconds to wait for it."""
    after = refilled(tokens_milli, elapsed_ms, per_second, burst) - MILLI
    return after, wait_for_token_s(after, per_second)


def bucket_state(
    key: str,
    per_second: float,
    burst: int,
    tokens_milli: int,
    elapsed_ms: float,
    cooling_until: str | None = None,
    cooling_reason: str | None = None,
) -> RateLimitBucket:
    """What health shows of a bucket read ``elapsed_ms`` after its last refill
    (negative: its refill starts that much later, a cooling down)."""
    now = refilled(tokens_milli, elapsed_ms, per_second, burst)
    waiting = math.ceil(-now / MILLI) if now < 0 else 0
    empty_for_s = 0.0 if now >= MILLI else (MILLI - now) / (per_second * MILLI)
    empty_for_s += max(0.0, -elapsed_ms) / 1000
    if cooling_until is None:
        cooling_reason = None
    return RateLimitBucket(
        key, per_second, burst, now / MILLI, waiting, empty_for_s, cooling_until, cooling_reason
    )


def too_long_a_wait(key: str, seconds: float) -> RetryAfter:
    """The one place that says how a pass ends when its token of rate limit ``key``
    is ``seconds`` away, beyond the pass budget: deferred, due again then (nothing
    charged; the steps that finished stay stored)."""
    return RetryAfter(seconds, reason=f"{_RATE_LIMIT} {key!r}{_TOO_LONG.format(seconds)}")


_RATE_LIMIT = "rate limit"
_TOO_LONG = ": a token is {:.3f} s away, beyond the pass budget"
_TOO_LONG_PATTERN = re.compile(
    rf"{_RATE_LIMIT} (?P<key>'.*'|\".*\"): a token is \d+\.\d{{3}} s away, beyond the pass budget"
)


def rate_limit_of_deferral(reason: str | None) -> str | None:
    """The rate limit key whose token was too far away, when ``reason`` is the
    ``deferred_reason`` :func:`too_long_a_wait` stored; else ``None`` (a handler's
    own ``RetryAfter``, or none)."""
    found = None if reason is None else _TOO_LONG_PATTERN.fullmatch(reason)
    if found is None:
        return None
    try:
        key = ast.literal_eval(found["key"])
    except (ValueError, SyntaxError):
        return None
    return key if isinstance(key, str) else None


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """What a database's limits hold now, for ``jobrun health`` and the console."""

    buckets: tuple[RateLimitBucket, ...] = ()
    slots: Mapping[str, int] = field(default_factory=dict)
    """Slots held now, by concurrency key (only keys with a slot held)."""
