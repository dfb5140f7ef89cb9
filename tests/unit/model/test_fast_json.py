"""Plain values written in one call (json's C encoder, or orjson when installed):
the same bytes as json's own piecewise encoder, the same refusals, the same
values decoded. The stored format must not depend on what is installed, so every
case runs on both paths (orjson's only where it is installed)."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobrun._core.model import fast_json
from jobrun._core.model.formats import OverCapError, encode_json, encode_json_within
from jobrun._core.model.queue_safety import queue_safety_problem

HAS_ORJSON = importlib.util.find_spec("orjson") is not None
PATHS = [
    "json",
    pytest.param(
        "orjson",
        marks=pytest.mark.skipif(not HAS_ORJSON, reason="orjson is not installed (speed extra)"),
    ),
]
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)
PIECEWISE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test once with json's C encoder alone, once with orjson (where installed)."""
    chosen: str = request.param
    with pytest.MonkeyPatch.context() as patch:
        if chosen == "json":
            patch.setattr(fast_json, "_orjson", None)
        assert fast_json.accelerator() == chosen
        yield chosen


def piecewise(value: Any) -> str:
    """What jobrun wrote before the one-call path: json's pure-Python encoder, piece by piece."""
    return "".join(PIECEWISE.iterencode(value))


def exactly(value: Any) -> str:
    """A value's repr, which tells 1 from 1.0 and -0.0 from 0.0 at any depth."""
    return repr(value)


keys = st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.none()
leaves = (
    st.integers()
    | st.integers(min_value=-(2**63) - 2, max_value=2**64 + 2)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(), inner, max_size=6)
        | st.dictionaries(keys, inner, max_size=3)
    ),
    max_leaves=40,
)


@pytest.mark.parametrize("chosen", PATHS)
@PROPERTY_SETTINGS
@given(values)
def test_every_value_is_written_byte_for_byte_as_json_writes_it_and_decodes_alike(
    chosen: str, value: Any
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        if chosen == "json":
            patch.setattr(fast_json, "_orjson", None)
        try:
            expected = piecewise(value)
            expected.encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            # A lone surrogate: refused as before, whatever the path.
            with pytest.raises(ValueError, match="surrogates not allowed"):
                encode_json_within(value, 1 << 20)
            return
        text = encode_json_within(value, 1 << 20)
        assert text == expected == encode_json(value)
        assert exactly(fast_json.loads_own(text)) == exactly(json.loads(text))


def test_a_typical_result_takes_the_one_call_path(path: str) -> None:
    result = {"id": 42, "name": "café ☕", "tags": ["a", "b"], "ok": True, "next": None}
    assert fast_json.plain_text(result, 1 << 20) == piecewise(result)
    with_float = {"score": 1e-05, "big": 2**70, "at": [1e16, -0.0]}
    # Floats and ints past 64 bits: json's C encoder, never orjson (which writes 0.00001).
    assert fast_json.plain_text(with_float, 1 << 20) == piecewise(with_float)
    assert piecewise(with_float) == '{"score":1e-05,"big":1180591620717411303424,"at":[1e+16,-0.0]}'


@pytest.mark.parametrize(
    "value",
    [
        {1: "int key", 2.5: "float key", None: "none"},
        {True: "bool key", "x": [False]},
        {"1": "a", 1: "b"},  # two keys that json writes alike: both kept, in order
        ("a", (1, 2), []),
        [[[[[]]]]],
    ],
)
def test_keys_json_turns_into_strings_and_tuples_are_written_as_json_writes_them(
    path: str, value: Any
) -> None:
    text = encode_json_within(value, 1 << 20)
    assert text == piecewise(value)
    assert exactly(fast_json.loads_own(text)) == exactly(json.loads(text))


def test_what_is_not_plain_takes_the_piecewise_path_with_its_own_refusal(path: str) -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular reference detected"):
        encode_json_within(cyclic, 1 << 20)
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_json_within({"when": {1, 2}}, 1 << 20)
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_json_within([math.inf], 1 << 20)
    with pytest.raises(UnicodeEncodeError):
        encode_json_within(["\ud800"], 1 << 20)

    class Level(int):
        pass

    # A subclass is written by json's rules (int.__repr__), never by another library's.
    assert encode_json_within([Level(3)], 100) == "[3]"
    assert fast_json.plain_text([Level(3)], 100) is None


def test_over_the_cap_the_message_is_the_piecewise_one(path: str) -> None:
    over = ["é" * 5, {"k": 1}]
    with pytest.raises(OverCapError) as fast:
        encode_json_within(over, 10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast_json, "plain_text", lambda value, max_bytes: None)
        patch.setattr("jobrun._core.model.formats.plain_text", lambda value, max_bytes: None)
        with pytest.raises(OverCapError) as slow:
            encode_json_within(over, 10)
    assert str(fast.value) == str(slow.value) == "at least 13 bytes of JSON, over the 10-byte cap"
    assert encode_json_within(["é" * 3], 10) == '["ééé"]'  # 10 bytes of UTF-8


def test_a_value_sharing_one_list_many_times_is_stopped_by_counting_not_by_writing(
    path: str,
) -> None:
    shared: list[Any] = [0]
    for _ in range(60):
        shared = [shared, shared]  # 2**60 leaves in the text, a few objects in memory
    assert fast_json.plain_text(shared, 1 << 20) is None
    with pytest.raises(OverCapError):
        encode_json_within(shared, 1 << 20)


def test_deep_values_take_the_piecewise_path(path: str) -> None:
    deep: Any = 1
    for _ in range(fast_json.MAX_DEPTH + 5):
        deep = [deep]
    assert fast_json.plain_text(deep, 1 << 20) is None
    assert encode_json_within(deep, 1 << 20) == piecewise(deep)


def test_long_numbers_are_decoded_by_json(path: str) -> None:
    text = encode_json_within([2**64, 2**64 - 1, "1234567890123456789012"], 1 << 20)
    assert exactly(fast_json.loads_own(text)) == exactly(
        [2**64, 2**64 - 1, "1234567890123456789012"]
    )


@pytest.mark.parametrize("chosen", PATHS)
@PROPERTY_SETTINGS
@given(values | st.lists(st.floats(), max_size=3))
def test_the_one_walk_check_writes_only_safe_values_and_as_the_long_path_does(
    chosen: str, value: Any
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        if chosen == "json":
            patch.setattr(fast_json, "_orjson", None)
        text = fast_json.queue_safe_text(value, 1 << 20)
        if queue_safety_problem(value, "payload") is not None:
            # Unsafe (a tuple, a key not a str, NaN): left to the check's refusal.
            assert text is None
            return
        try:
            expected = piecewise(value).encode("utf-8").decode("utf-8")
        except UnicodeEncodeError:
            expected = None  # a lone surrogate: the long path refuses it in its words
        if type(value) not in (list, dict):
            expected = None  # a scalar: encode_json_within writes it whole anyway
        assert text == expected


def test_a_typical_payload_is_checked_and_written_in_one_walk(path: str) -> None:
    payload = {"shop": "shop-42", "ids": [1, 2, 3], "ratio": 0.5, "dry": False, "note": None}
    assert fast_json.queue_safe_text(payload, 1 << 20) == piecewise(payload)
    assert fast_json.queue_safe_text(payload, 10) is None  # over the cap: the long path says so
    cycle: list[Any] = []
    cycle.append(cycle)
    assert fast_json.queue_safe_text(cycle, 1 << 20) is None
    assert fast_json.queue_safe_text({"at": (1, 2)}, 1 << 20) is None
