"""The token bucket's arithmetic in whole milli-tokens: refills, takes, the health it reports,
and the deferral that names its rate limit."""

from __future__ import annotations

import pytest

import jobrun
from jobrun._core.limits.buckets import (
    MILLI,
    bucket_state,
    rate_limit_of_deferral,
    refilled,
    spent_at_once,
    take,
    too_long_a_wait,
    wait_for_token_s,
)


def test_a_bucket_refills_whole_milli_tokens_up_to_what_it_spends_at_once() -> None:
    # 50/s is 50 milli-tokens a millisecond.
    assert refilled(0, 20, 50.0, 5) == 1000
    # Declared burst 5: 3 at once, 2 kept back for the jitter at the API.
    assert refilled(0, 10_000, 50.0, 5) == 3 * MILLI
    assert [spent_at_once(burst) for burst in (1, 2, 3, 4, 5, 10)] == [1, 1, 2, 2, 3, 5]
    # A fraction of a milli-token is dropped, never rounded up.
    assert refilled(0, 1, 0.5, 5) == 0
    assert refilled(0, 3, 0.5, 5) == 1
    # A clock that went back adds nothing.
    assert refilled(-2000, -50, 50.0, 5) == -2000


def test_a_take_reserves_and_says_how_long_to_wait() -> None:
    assert take(3 * MILLI, 0, 50.0, 5) == (2 * MILLI, 0.0)
    after, wait_s = take(0, 0, 50.0, 5)
    assert (after, wait_s) == (-MILLI, 0.02)
    after, wait_s = take(-MILLI, 0, 50.0, 5)
    assert (after, wait_s) == (-2 * MILLI, 0.04)
    assert wait_for_token_s(500, 1.0) == 0.0


def test_health_reads_waiters_and_how_long_the_bucket_stays_empty() -> None:
    state = bucket_state("api", 2.0, 3, -2500, 250)  # -2500 + 500 after 250 ms
    assert (state.tokens, state.waiting, state.empty_for_s) == (-2.0, 2, 1.5)
    full = bucket_state("api", 2.0, 4, 2 * MILLI, 60_000)
    assert (full.tokens, full.waiting, full.empty_for_s) == (2.0, 0, 0.0)


def test_a_wait_beyond_the_budget_is_one_named_exception() -> None:
    error = too_long_a_wait("api", 12.5)
    assert isinstance(error, jobrun.RetryAfter)
    assert "12.500 s" in error.reason
    assert error.seconds == 12.5


@pytest.mark.parametrize("key", ["api", "it's", 'say "hi"', "x: a token is 1.000 s away"])
def test_a_deferral_for_a_token_names_its_rate_limit(key: str) -> None:
    assert rate_limit_of_deferral(too_long_a_wait(key, 3).reason) == key


@pytest.mark.parametrize(
    "reason", [None, "", "the API said later", "rate limit 'api'", "rate limit api: a token"]
)
def test_another_deferral_names_no_rate_limit(reason: str | None) -> None:
    assert rate_limit_of_deferral(reason) is None
