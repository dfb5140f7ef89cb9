"""RetryPolicy: defaults, validation, and exponential backoff with jitter after the cap."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrun import JobValidationError, RetryPolicy
from jobrun._core.rules.retry import DEFAULT_RETRY

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
JUST_UNDER_ONE = 1 - 2**-53  # the largest value random.random() can return
# With r this close to 1, 0.8 + r * 0.4 rounds to the float 1.2 (as it does in JavaScript),
# so the jitter's upper end is reachable in floating point; r = 0.999 stays visibly below it.
NEAR_ONE = 0.999


def constant(value: float) -> Any:
    return lambda: value


def never_called() -> float:
    raise AssertionError("a zero delay must not draw a random number")


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.base_delay_ms, policy.max_delay_ms) == (5, 1000, 300_000)
    assert policy == DEFAULT_RETRY


def test_zero_delays_and_one_attempt_are_allowed() -> None:
    policy = RetryPolicy(max_attempts=1, base_delay_ms=0, max_delay_ms=0)
    assert (policy.max_attempts, policy.base_delay_ms, policy.max_delay_ms) == (1, 0, 0)


def test_a_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize("field", ["max_attempts", "base_delay_ms", "max_delay_ms"])
@pytest.mark.parametrize("bad", [True, False, 1.0, 2.5, "3", None, [1]], ids=repr)
def test_fields_must_be_ints(field: str, bad: Any) -> None:
    with pytest.raises(TypeError, match=f"RetryPolicy.{field} must be an int") as caught:
        RetryPolicy(**{field: bad})
    assert type(bad).__name__ in str(caught.value)


@pytest.mark.parametrize(
    ("field", "bad", "lowest"),
    [
        ("max_attempts", 0, 1),
        ("max_attempts", -1, 1),
        ("base_delay_ms", -1, 0),
        ("max_delay_ms", -1, 0),
    ],
)
def test_fields_have_lower_bounds(field: str, bad: int, lowest: int) -> None:
    with pytest.raises(ValueError, match=f"RetryPolicy.{field} must be at least {lowest}") as e:
        RetryPolicy(**{field: bad})
    assert str(bad) in str(e.value)


@pytest.mark.parametrize(
    ("attempts", "raw"),
    [(1, 1000), (2, 2000), (3, 4000), (9, 256_000), (10, 300_000), (50, 300_000)],
)
def test_delay_doubles_up_to_the_cap_with_jitter_between_0_8_and_1_2(
    attempts: int, raw: int
) -> None:
    policy = RetryPolicy()
    assert policy.delay_ms(attempts, constant(0.0)) == pytest.approx(raw * 0.8)
    assert policy.delay_ms(attempts, constant(0.5)) == pytest.approx(raw)
    near_top = policy.delay_ms(attempts, constant(NEAR_ONE))
    assert raw * 1.19 < near_top < raw * 1.2
    assert near_top == pytest.approx(raw * 1.1996)
    assert policy.delay_ms(attempts, constant(JUST_UNDER_ONE)) <= raw * 1.2


def test_jitter_is_applied_after_the_cap() -> None:
    policy = RetryPolicy(max_attempts=100, base_delay_ms=1000, max_delay_ms=300_000)
    assert policy.delay_ms(30, constant(NEAR_ONE)) == pytest.approx(359_880)
    assert policy.delay_ms(30, constant(JUST_UNDER_ONE)) == pytest.approx(360_000)
    assert policy.delay_ms(30, constant(0.0)) == pytest.approx(240_000)


@pytest.mark.parametrize(
    "policy",
    [RetryPolicy(base_delay_ms=0), RetryPolicy(max_delay_ms=0), RetryPolicy(0 + 1, 0, 0)],
)
def test_a_zero_delay_is_never_jittered(policy: RetryPolicy) -> None:
    for attempts in (1, 2, 10):
        assert policy.delay_ms(attempts, never_called) == 0


@PROPERTY_SETTINGS
@given(
    st.integers(1, 10_000),
    st.integers(0, 10**7),
    st.integers(0, 10**8),
    st.floats(0, 1, exclude_max=True),
)
def test_delay_formula(attempts: int, base: int, cap: int, random: float) -> None:
    policy = RetryPolicy(max_attempts=10_000, base_delay_ms=base, max_delay_ms=cap)
    raw = min(base * 2 ** (attempts - 1), cap)
    delay = policy.delay_ms(attempts, constant(random))
    if raw == 0:
        assert delay == 0
    else:
        assert delay == pytest.approx(raw * (0.8 + random * 0.4))
        assert raw * 0.8 <= delay <= raw * 1.2
        assert delay <= cap * 1.2


@pytest.mark.parametrize(
    ("policy", "attempts", "random", "expected"),
    [
        (RetryPolicy(), 1, 0.5, "2026-01-01T00:00:01.000Z"),
        (RetryPolicy(), 1, 0.0, "2026-01-01T00:00:00.800Z"),
        (RetryPolicy(), 3, 0.0, "2026-01-01T00:00:03.200Z"),
        # 1001 * 0.9 = 900.9 ms: the fraction is truncated, not rounded.
        (RetryPolicy(base_delay_ms=1001), 1, 0.25, "2026-01-01T00:00:00.900Z"),
        (RetryPolicy(base_delay_ms=3), 1, JUST_UNDER_ONE, "2026-01-01T00:00:00.003Z"),
        (RetryPolicy(), 40, NEAR_ONE, "2026-01-01T00:05:59.880Z"),
        (RetryPolicy(), 40, JUST_UNDER_ONE, "2026-01-01T00:06:00.000Z"),
        (RetryPolicy(base_delay_ms=0), 4, 0.9, "2026-01-01T00:00:00.000Z"),
    ],
)
def test_next_attempt_at_adds_whole_milliseconds(
    policy: RetryPolicy, attempts: int, random: float, expected: str
) -> None:
    assert (
        policy.next_attempt_at(attempts, "2026-01-01T00:00:00.000Z", constant(random)) == expected
    )


def test_next_attempt_at_with_zero_delay_is_the_failure_instant() -> None:
    failed_at = "2026-03-04T05:06:07.089Z"
    policy = RetryPolicy(base_delay_ms=0)
    assert policy.next_attempt_at(1, failed_at, never_called) == failed_at


@pytest.mark.parametrize(
    ("field", "bad"),
    [("max_attempts", 0), ("base_delay_ms", -1), ("max_delay_ms", "3"), ("max_attempts", None)],
)
def test_a_refused_field_is_named_in_the_errors(field: str, bad: Any) -> None:
    with pytest.raises(JobValidationError) as caught:
        RetryPolicy(**{field: bad})
    assert [entry["path"] for entry in caught.value.errors] == [field]
