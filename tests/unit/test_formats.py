"""Stored formats: instants as fixed-shape text, compact JSON, and the ULID mint."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrun._core.model.formats import (
    JSON_SCALARS,
    MalformedColumnError,
    OverCapError,
    add_milliseconds,
    decode_counters,
    decode_json,
    encode_json,
    encode_json_within,
    format_instant,
    parse_instant,
)
from jobrun._core.model.ids import UlidMint
from jobrun._system import mint_run_id

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
INSTANT_SHAPE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_SHAPE = re.compile(f"[{CROCKFORD}]{{26}}")

# Offsets up to +-23:59; the range keeps conversion to UTC inside datetime's years 1..9999.
zones = st.builds(
    lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-1439, 1439)
) | st.just(UTC)
aware_instants = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=zones
)


def truncated_to_ms(moment: datetime) -> datetime:
    utc = moment.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


# --- instants -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05.000Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 678_999, tzinfo=UTC), "2026-01-02T03:04:05.678Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 999_999, tzinfo=UTC), "2026-01-02T03:04:05.999Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 1_000, tzinfo=UTC), "2026-01-02T03:04:05.001Z"),
        (datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=UTC), "2026-01-02T03:04:05.000Z"),
        (
            datetime(2026, 1, 1, 1, 30, tzinfo=timezone(timedelta(hours=2))),
            "2025-12-31T23:30:00.000Z",
        ),
        (
            datetime(2025, 12, 31, 20, 0, 0, 250_000, tzinfo=timezone(timedelta(hours=-5))),
            "2026-01-01T01:00:00.250Z",
        ),
        (datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000Z"),
        (datetime(999, 12, 31, 23, 59, 59, tzinfo=UTC), "0999-12-31T23:59:59.000Z"),
        (datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), "9999-12-31T23:59:59.999Z"),
    ],
)
def test_format_instant_examples(moment: datetime, text: str) -> None:
    assert format_instant(moment) == text


def test_format_instant_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_instant(datetime(2026, 1, 1))


@PROPERTY_SETTINGS
@given(aware_instants)
def test_format_instant_always_has_the_stored_shape(moment: datetime) -> None:
    text = format_instant(moment)
    assert INSTANT_SHAPE.fullmatch(text), text
    assert text == truncated_to_ms(moment).isoformat(timespec="milliseconds")[:-6] + "Z"


@PROPERTY_SETTINGS
@given(aware_instants, aware_instants)
def test_lexical_order_is_time_order(first: datetime, second: datetime) -> None:
    first_text, second_text = format_instant(first), format_instant(second)
    first_ms, second_ms = truncated_to_ms(first), truncated_to_ms(second)
    assert (first_text < second_text) == (first_ms < second_ms)
    assert (first_text == second_text) == (first_ms == second_ms)


@PROPERTY_SETTINGS
@given(aware_instants)
def test_parse_instant_round_trips(moment: datetime) -> None:
    text = format_instant(moment)
    parsed = parse_instant(text)
    assert parsed == truncated_to_ms(moment)
    assert parsed.utcoffset() == timedelta(0)
    assert format_instant(parsed) == text


def test_parse_instant_reads_other_iso_forms_as_utc() -> None:
    assert parse_instant("2026-01-01T02:00:00+02:00") == datetime(2026, 1, 1, tzinfo=UTC)
    naive = parse_instant("2026-01-01T00:00:00")
    assert naive == datetime(2026, 1, 1, tzinfo=UTC)
    assert naive.tzinfo is not None
    with pytest.raises(ValueError, match="isoformat"):
        parse_instant("not a time")


@pytest.mark.parametrize(
    ("delay_ms", "text"),
    [
        (0, "2026-01-01T00:00:00.000Z"),
        (0.999, "2026-01-01T00:00:00.000Z"),
        (1.999, "2026-01-01T00:00:00.001Z"),
        (1500, "2026-01-01T00:00:01.500Z"),
        (86_400_000, "2026-01-02T00:00:00.000Z"),
    ],
)
def test_add_milliseconds_truncates_fractions(delay_ms: float, text: str) -> None:
    assert add_milliseconds("2026-01-01T00:00:00.000Z", delay_ms) == text


# --- JSON ---------------------------------------------------------------------------------


def test_encode_json_is_compact_and_keeps_non_ascii() -> None:
    value = {"a": [1, 2.5, "é ✓ 日本"], "b": {"c": None, "d": True}, "e": -0.0}
    assert encode_json(value) == '{"a":[1,2.5,"é ✓ 日本"],"b":{"c":null,"d":true},"e":-0.0}'
    assert encode_json(10**20) == "100000000000000000000"
    assert encode_json([]) == "[]"


scalars = (
    st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
)


@PROPERTY_SETTINGS
@given(scalars)
def test_a_scalar_is_encoded_whole_as_json_writes_it_and_decodes_to_itself(value: Any) -> None:
    """The step path returns a scalar result as it is instead of decoding its JSON:
    sound only because the text is json's own and decodes to an equal value, same type."""
    try:
        text = encode_json_within(value, 1 << 20)
    except ValueError:
        # Only text with a lone surrogate (no UTF-8 for it) is refused, as before.
        assert isinstance(value, str)
        with pytest.raises(UnicodeEncodeError):
            value.encode("utf-8")
        return
    assert text == encode_json(value)
    decoded = json.loads(text)
    assert type(value) in JSON_SCALARS
    assert (type(decoded), decoded) == (type(value), value)
    if type(value) is float:
        # -0.0 keeps its sign through the text.
        assert math.copysign(1, decoded) == math.copysign(1, value)


def test_a_scalar_over_the_cap_is_refused_by_its_utf8_size() -> None:
    assert encode_json_within("é" * 4, 10) == '"éééé"'  # 10 bytes of UTF-8
    with pytest.raises(OverCapError, match="at least 12 bytes"):
        encode_json_within("é" * 5, 10)
    with pytest.raises(OverCapError):
        encode_json_within(10**12, 12)
    with pytest.raises(ValueError, match="not JSON"):
        encode_json_within(math.nan, 100)


def test_a_scalar_subclass_takes_the_general_path() -> None:
    class Level(int):
        pass

    assert type(Level(3)) not in JSON_SCALARS
    assert encode_json_within(Level(3), 100) == encode_json(Level(3)) == "3"


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_encode_json_refuses_non_finite_numbers(number: float) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_json({"x": [number]})


@pytest.mark.parametrize(
    "text", ["{", "", "nul", "[1,]", "{'a': 1}", '{"a":1} trailing', "[" * 100_000]
)
def test_decode_json_names_the_column_and_says_json(text: str) -> None:
    with pytest.raises(MalformedColumnError) as caught:
        decode_json(text, "payload")
    assert isinstance(caught.value, ValueError)
    assert caught.value.column == "payload"
    assert "JSON" in str(caught.value)
    assert "payload" in str(caught.value)


@pytest.mark.parametrize(
    "text", ["NaN", "Infinity", "-Infinity", "[1,NaN]", '{"a":{"b":Infinity}}']
)
def test_decode_json_refuses_non_finite_tokens(text: str) -> None:
    with pytest.raises(MalformedColumnError, match="JSON") as caught:
        decode_json(text, "cursor")
    assert "cursor" in str(caught.value)


def test_decode_json_reads_what_encode_json_writes() -> None:
    value = {"a": [1, 2.5, "é"], "b": None}
    assert decode_json(encode_json(value), "payload") == value
    assert decode_json("null", "payload") is None


def test_decode_counters_reads_an_object_of_numbers() -> None:
    assert decode_counters('{"items":3,"ratio":0.5}') == {"items": 3, "ratio": 0.5}
    assert decode_counters("{}") == {}


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "[1]",
        "1",
        "null",
        '"x"',
        '{"a":"1"}',
        '{"a":true}',
        '{"a":null}',
        '{"a":[1]}',
        '{"a":{}}',
        '{"a":1e999}',
        '{"a":-1e999}',
        '{"a":NaN}',
        "{",
    ],
)
def test_decode_counters_refuses_anything_but_finite_numbers(text: str) -> None:
    with pytest.raises(MalformedColumnError) as caught:
        decode_counters(text)
    assert caught.value.column == "counters"
    assert "counters" in str(caught.value)
    assert "JSON" in str(caught.value)


# --- the ULID mint ------------------------------------------------------------------------


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


@pytest.mark.parametrize(("text", "token"), [("[1,NaN]", "NaN"), ('{"a":1e999}', "1e999")])
def test_a_non_finite_json_number_is_named_in_the_error(text: str, token: str) -> None:
    with pytest.raises(MalformedColumnError, match=f"cursor is not valid JSON: {token} "):
        decode_json(text, "cursor")
