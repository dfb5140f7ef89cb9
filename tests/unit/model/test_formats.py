"""Stored formats: instants as fixed-shape text, and compact JSON (run ids: ``test_ids.py``)."""

from __future__ import annotations

import json
import math
import re
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

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
INSTANT_SHAPE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")

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


@pytest.mark.parametrize(("text", "token"), [("[1,NaN]", "NaN"), ('{"a":1e999}', "1e999")])
def test_a_non_finite_json_number_is_named_in_the_error(text: str, token: str) -> None:
    with pytest.raises(MalformedColumnError, match=f"cursor is not valid JSON: {token} "):
        decode_json(text, "cursor")
