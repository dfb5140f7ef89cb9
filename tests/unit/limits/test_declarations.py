"""Rate and concurrency limit declarations: bad ones refused, one declaration a key, the
longest prefix matched, and the pacer that spaces what a burst lets through (the bucket's
arithmetic is in ``test_buckets.py``)."""

from __future__ import annotations

import pytest

import jobrun
from jobrun._core.limits.declarations import Pacer


def test_the_same_declaration_twice_is_accepted_and_another_refused() -> None:
    registry = jobrun.JobRegistry()
    registry.rate_limit("api.example.com", per_second=50, burst=5)
    registry.rate_limit("api.example.com", per_second=50, burst=5)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=40, burst=5)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=50, burst=6)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.rate_limit("api.example.com", per_second=50, burst=5, store=object())
    registry.concurrency_limit("tenant-", 3)
    registry.concurrency_limit("tenant-", 3)
    with pytest.raises(jobrun.JobConflictError, match="already declared"):
        registry.concurrency_limit("tenant-", 4)


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"key": "k", "per_second": 0, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": -1.5, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": float("inf"), "burst": 1}, "per_second"),
        ({"key": "k", "per_second": float("nan"), "burst": 1}, "per_second"),
        ({"key": "k", "per_second": True, "burst": 1}, "per_second"),
        ({"key": "k", "per_second": "50", "burst": 1}, "per_second"),
        ({"key": "k", "per_second": 1, "burst": 0}, "burst"),
        ({"key": "k", "per_second": 1, "burst": True}, "burst"),
        ({"key": "k", "per_second": 1, "burst": 1.5}, "burst"),
        ({"key": "k", "per_second": 1, "burst": 10**7}, "burst"),
        ({"key": 7, "per_second": 1, "burst": 1}, "key"),
        ({"key": "", "per_second": 1, "burst": 1}, "key"),
        ({"key": "a\x00b", "per_second": 1, "burst": 1}, "key"),
    ],
)
def test_a_bad_rate_limit_is_refused(arguments: dict[str, object], path: str) -> None:
    registry = jobrun.JobRegistry()
    key = arguments.pop("key")
    with pytest.raises(jobrun.JobValidationError) as refused:
        # Wrong types on purpose: the refusal is what is tested.
        registry.rate_limit(key, **arguments)  # type: ignore[arg-type]
    assert refused.value.errors[0]["path"] == path
    assert registry.limits.rates == {}


@pytest.mark.parametrize(
    ("prefix", "most", "path"),
    [
        ("tenant-", 0, "most"),
        ("tenant-", True, "most"),
        ("tenant-", 2.0, "most"),
        ("", 1, "prefix"),
        (None, 1, "prefix"),
        (b"tenant-", 1, "prefix"),
    ],
)
def test_a_bad_concurrency_limit_is_refused(prefix: object, most: object, path: str) -> None:
    registry = jobrun.JobRegistry()
    with pytest.raises(jobrun.JobValidationError) as refused:
        # Wrong types on purpose: the refusal is what is tested.
        registry.concurrency_limit(prefix, most)  # type: ignore[arg-type]
    assert refused.value.errors[0]["path"] == path


def test_the_longest_declared_prefix_wins_and_an_unmatched_key_is_a_mistake() -> None:
    registry = jobrun.JobRegistry()
    registry.concurrency_limit("tenant-", 3)
    registry.concurrency_limit("tenant-vip-", 10)
    limits = registry.limits
    assert limits.for_step("s", None, "tenant-7").concurrency == registry.limits.prefixes["tenant-"]
    vip = limits.for_step("s", None, "tenant-vip-1")
    assert (vip.concurrency_key, vip.concurrency and vip.concurrency.most) == ("tenant-vip-1", 10)
    with pytest.raises(jobrun.HandlerMistakeError, match="matches no declared prefix"):
        limits.for_step("s", None, "customer-7")
    with pytest.raises(jobrun.HandlerMistakeError, match="must be a str"):
        limits.for_step("s", None, 7)
    with pytest.raises(jobrun.HandlerMistakeError, match="is not declared"):
        limits.for_step("s", "api", None)
    assert not limits.for_step("s", None, None).any


def test_the_pacer_lets_what_is_spent_at_once_go_then_spaces_the_rest() -> None:
    pacer = Pacer(per_second=100, burst=5)
    # A process waking late with six granted tokens: three now, then one per 10 ms.
    delays = [pacer.delay_s(50.0) for _ in range(6)]
    assert delays == pytest.approx([0, 0, 0, 0.01, 0.02, 0.03])
    # In step with the rate, nothing waits; after a lull three go at once again, no more.
    assert pacer.delay_s(50.04) == pytest.approx(0.0)
    assert [pacer.delay_s(60.0) for _ in range(4)] == pytest.approx([0, 0, 0, 0.01])


def test_a_registry_has_one_pacer_per_rate_key() -> None:
    registry = jobrun.JobRegistry()
    registry.rate_limit("api", per_second=5, burst=4)
    api = registry.limits.rates["api"]
    assert registry.limits.pacer(api) is registry.limits.pacer(api)
    assert [registry.limits.pacer(api).delay_s(1.0) for _ in range(3)] == pytest.approx([0, 0, 0.2])
