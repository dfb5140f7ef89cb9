"""Run ids: the ULID mint (26 Crockford characters, the time first, sorted in mint order
whatever the clock does), and the process's own mint over the wall clock."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrun._core.model.ids import UlidMint
from jobrun._host.system import mint_run_id

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_SHAPE = re.compile(f"[{CROCKFORD}]{{26}}")


def decode_base32(text: str) -> int:
    number = 0
    for character in text:
        number = number * 32 + CROCKFORD.index(character)
    return number


class ScriptedClock:
    """Milliseconds from a list, then the last value forever."""

    def __init__(self, values: list[int]) -> None:
        self._values: Iterator[int] = iter(values)
        self._last = values[0]

    def __call__(self) -> int:
        self._last = next(self._values, self._last)
        return self._last


def fixed_bytes(value: bytes) -> Any:
    def draw(count: int) -> bytes:
        assert count == 10
        return value

    return draw


def test_a_ulid_is_26_crockford_characters_with_the_time_first() -> None:
    mint = UlidMint(lambda: 1_767_225_600_000, fixed_bytes(bytes(range(10))))
    ulid = mint()
    assert ULID_SHAPE.fullmatch(ulid)
    assert decode_base32(ulid[:10]) == 1_767_225_600_000
    assert decode_base32(ulid[10:]) == int.from_bytes(bytes(range(10)), "big")


def test_ulid_extremes() -> None:
    assert UlidMint(lambda: 0, fixed_bytes(bytes(10)))() == "0" * 26
    assert UlidMint(lambda: 2**48 - 1, fixed_bytes(b"\xff" * 10))() == "7" + "Z" * 25


def test_ids_in_one_millisecond_increment_the_random_part() -> None:
    mint = UlidMint(lambda: 1000, fixed_bytes(b"\x00" * 9 + b"\x05"))
    ids = [mint() for _ in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert {ulid[:10] for ulid in ids} == {ids[0][:10]}
    assert [decode_base32(ulid[10:]) for ulid in ids] == [5, 6, 7, 8, 9]


def test_a_clock_going_backwards_holds_the_last_timestamp() -> None:
    mint = UlidMint(ScriptedClock([5000, 4000, 3000, 5000, 6000]), fixed_bytes(b"\x80" * 10))
    ids = [mint() for _ in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    assert [decode_base32(ulid[:10]) for ulid in ids] == [5000, 5000, 5000, 5000, 6000]


def test_a_new_millisecond_draws_fresh_random_bytes() -> None:
    draws = iter([b"\xff" * 10, b"\x00" * 10])
    mint = UlidMint(ScriptedClock([1, 2]), lambda count: next(draws))
    first, second = mint(), mint()
    assert first[10:] == "Z" * 16
    assert second[10:] == "0" * 16
    assert first < second


def test_running_out_of_ids_in_one_millisecond_is_an_error() -> None:
    mint = UlidMint(lambda: 7, fixed_bytes(b"\xff" * 10))
    mint()
    with pytest.raises(OverflowError):
        mint()


@PROPERTY_SETTINGS
@given(
    st.lists(st.integers(0, 2**48 - 2), min_size=1, max_size=50),
    st.lists(st.binary(min_size=10, max_size=10), min_size=50, max_size=50),
)
def test_ids_sort_in_mint_order_whatever_the_clock_does(
    milliseconds: list[int], randoms: list[bytes]
) -> None:
    draws = iter(randoms)
    mint = UlidMint(ScriptedClock(milliseconds), lambda count: next(draws))
    ids = [mint() for _ in milliseconds]
    assert all(ULID_SHAPE.fullmatch(ulid) for ulid in ids)
    assert all(earlier < later for earlier, later in itertools.pairwise(ids))
    assert decode_base32(ids[0][:10]) == milliseconds[0]
    assert [decode_base32(ulid[:10]) for ulid in ids] == [
        max(milliseconds[: index + 1]) for index in range(len(milliseconds))
    ]


def test_the_process_mint_uses_the_wall_clock_and_sorts() -> None:
    before = int(datetime.now(UTC).timestamp() * 1000)
    ids = [mint_run_id() for _ in range(1000)]
    after = int(datetime.now(UTC).timestamp() * 1000)
    assert all(ULID_SHAPE.fullmatch(ulid) for ulid in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert before <= decode_base32(ids[0][:10]) <= after
    assert json.loads(json.dumps(ids)) == ids
