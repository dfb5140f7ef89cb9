"""Queue-safety: only values that come back from JSON storage unchanged are accepted."""

from __future__ import annotations

import enum
import json
import math
import uuid
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jobrun
from jobrun._core.model.formats import encode_json
from jobrun._core.model.queue_safety import MAX_DEPTH, encode_queue_safe

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


def refusal(value: Any, root: str = "payload") -> jobrun.JobValidationError:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.assert_queue_safe(value, root)
    return caught.value


def refused_path(value: Any, root: str = "payload") -> str:
    errors = refusal(value, root).errors
    assert len(errors) == 1
    return errors[0]["path"]


def same_json_value(left: Any, right: Any) -> bool:
    """Equal, and of exactly the same types all the way down (1 is not 1.0, True is not 1)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same_json_value, left, right))
    if isinstance(left, dict):
        return list(left) == list(right) and all(same_json_value(left[k], right[k]) for k in left)
    return bool(left == right)


@dataclass
class Point:
    x: int


class Plain:
    def method(self) -> None:
        pass


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class Ratio(float):
    pass


# --- what is accepted ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(2**70),
        1.5,
        -0.0,
        1e308,
        "",
        "héllo ✓",
        [],
        {},
        [None, True, 1, 2.5, "s", [], {}],
        {"a": {"b": [1, {"c": None}]}, "": 0, "1": "key that looks like a number"},
    ],
    # ASCII ids: pytest escapes other characters with backslashes, and an escaped id is
    # not found again when a tool (mutmut) passes it back on pytest's command line.
    ids=lambda value: repr(value).encode("ascii", "replace").decode("ascii"),
)
def test_json_safe_values_pass_and_round_trip(value: Any) -> None:
    jobrun.assert_queue_safe(value, "payload")
    assert same_json_value(json.loads(encode_json(value)), value)


def test_a_shared_sub_object_that_is_not_a_cycle_is_fine() -> None:
    shared = {"id": 7}
    jobrun.assert_queue_safe(
        {"a": shared, "b": shared, "c": [shared, [shared]], "d": {"e": shared}}, "payload"
    )
    twice = [1, 2]
    jobrun.assert_queue_safe([twice, twice], "payload")


def test_nesting_up_to_the_depth_limit_passes_and_round_trips() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH):
        value = [value]
    jobrun.assert_queue_safe(value, "payload")
    assert json.loads(encode_json(value)) == value


# --- what is refused ----------------------------------------------------------------------


def _function() -> None:
    pass


REFUSED = [
    pytest.param(b"raw", "bytes", id="bytes"),
    pytest.param(bytearray(b"raw"), "bytearray", id="bytearray"),
    pytest.param((1, 2), "tuple", id="tuple"),
    pytest.param({1, 2}, "set", id="set"),
    pytest.param(frozenset({1}), "frozenset", id="frozenset"),
    pytest.param(datetime(2026, 1, 1, tzinfo=UTC), "datetime", id="datetime"),
    pytest.param(date(2026, 1, 1), "date", id="date"),
    pytest.param(timedelta(seconds=1), "timedelta", id="timedelta"),
    pytest.param(Decimal("1.5"), "Decimal", id="Decimal"),
    pytest.param(Fraction(1, 3), "Fraction", id="Fraction"),
    pytest.param(complex(1, 2), "complex", id="complex"),
    pytest.param(uuid.UUID(int=1), "UUID", id="UUID"),
    pytest.param(Point(1), "Point", id="dataclass-instance"),
    pytest.param(Plain(), "Plain", id="class-instance"),
    pytest.param(object(), "object", id="object"),
    pytest.param(Plain, "type", id="a-class-itself"),
    pytest.param(_function, "function", id="function"),
    pytest.param(lambda: None, "function", id="lambda"),
    pytest.param(len, "function", id="builtin-function"),
    pytest.param(Plain().method, "function", id="bound-method"),
    pytest.param(OrderedDict(a=1), "OrderedDict", id="OrderedDict"),
    pytest.param(defaultdict(list), "defaultdict", id="defaultdict"),
    pytest.param(Counter("ab"), "Counter", id="Counter"),
    pytest.param(Colour.RED, "Colour", id="IntEnum"),
    pytest.param(Name("x"), "Name", id="str-subclass"),
    pytest.param(Ratio(1.5), "Ratio", id="float-subclass"),
    pytest.param(math.nan, "nan", id="nan"),
    pytest.param(math.inf, "inf", id="inf"),
    pytest.param(-math.inf, "-inf", id="-inf"),
    pytest.param(iter([]), "iterator", id="iterator"),
    pytest.param(range(3), "range", id="range"),
]


@pytest.mark.parametrize(("unsafe", "what"), REFUSED)
def test_unsafe_values_are_refused_where_they_are(unsafe: Any, what: str) -> None:
    for value, path in [
        (unsafe, "payload"),
        ({"source": {"bytes": unsafe}}, "payload.source.bytes"),
        ({"steps": [unsafe]}, "payload.steps.0"),
        ([1, "two", [None, unsafe]], "payload.2.1"),
    ]:
        error = refusal(value)
        assert error.errors == [{"path": path, "message": error.errors[0]["message"]}]
        assert what in error.errors[0]["message"]
        assert path in str(error)
        assert what in str(error)


def test_the_error_is_a_validation_error_with_one_entry() -> None:
    error = refusal({"source": {"bytes": b"\x00"}})
    assert isinstance(error, jobrun.JobRunError)
    assert isinstance(error, ValueError)
    assert error.code == "validation_failed"
    assert error.errors == [{"path": "payload.source.bytes", "message": error.errors[0]["message"]}]
    message = error.errors[0]["message"]
    assert isinstance(message, str)
    assert "bytes" in message
    assert str(error).startswith("payload is not queue-safe: payload.source.bytes is a bytes")


def test_the_root_name_starts_the_path() -> None:
    assert refused_path(b"x", root="cursor") == "cursor"
    assert refused_path({"page": (1,)}, root="cursor") == "cursor.page"
    assert str(refusal(b"x", root="cursor")).startswith("cursor is not queue-safe")


@pytest.mark.parametrize(
    ("value", "path", "key_type"),
    [
        ({"m": {1: "x"}}, "payload.m.1", "int"),
        ({"m": {None: "x"}}, "payload.m.None", "NoneType"),
        ({"m": {True: "x"}}, "payload.m.True", "bool"),
        ({"m": {1.5: "x"}}, "payload.m.1.5", "float"),
        ({(1, 2): "x"}, "payload.(1, 2)", "tuple"),
        ({Name("k"): "x"}, "payload.k", "Name"),
        ([{"ok": 1, 2: "x"}], "payload.0.2", "int"),
    ],
)
def test_non_str_keys_are_refused_at_the_dict_path_then_the_key(
    value: Any, path: str, key_type: str
) -> None:
    error = refusal(value)
    assert error.errors[0]["path"] == path
    assert key_type in error.errors[0]["message"]
    assert "key" in error.errors[0]["message"]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        # Lists in index order, dicts in insertion order, depth first.
        ([b"first", (2,)], "payload.0"),
        ({"z": b"", "a": set()}, "payload.z"),
        ({"a": 1, "b": [0, {"c": [None, b"deep"]}], "d": b"later"}, "payload.b.1.c.1"),
        ([[[1, [2, (3,)]]], b"shallow-but-later"], "payload.0.0.1.1"),
        # A bad key is reported in order: after the subtrees of the keys before it...
        ({"a": {"deep": b"x"}, 1: "y"}, "payload.a.deep"),
        # ...and before the values and keys after it.
        ({"a": {"deep": "fine"}, 1: "y", "b": b"x"}, "payload.1"),
        ({"a": [1, {2: "x"}], "b": {3: "y"}}, "payload.a.1.2"),
    ],
)
def test_the_first_violation_depth_first_is_reported(value: Any, path: str) -> None:
    assert refused_path(value) == path


def test_nan_and_infinity_are_named() -> None:
    for number, text in [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")]:
        error = refusal({"ratio": number})
        assert error.errors[0]["path"] == "payload.ratio"
        assert error.errors[0]["message"].startswith(f"{text}, ")
        assert "JSON" in error.errors[0]["message"]


# --- cycles, depth and size ---------------------------------------------------------------


def test_a_list_that_contains_itself_is_a_cycle() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    error = refusal(loop)
    assert error.errors[0]["path"] == "payload.1"
    assert "cycle" in error.errors[0]["message"]


def test_a_dict_that_contains_itself_is_a_cycle() -> None:
    loop: dict[str, Any] = {"name": "x"}
    loop["self"] = loop
    error = refusal({"wrapper": loop})
    assert error.errors[0]["path"] == "payload.wrapper.self"
    assert "cycle" in error.errors[0]["message"]


def test_an_indirect_cycle_is_found_where_it_closes() -> None:
    first: dict[str, Any] = {}
    second: list[Any] = [first]
    first["next"] = second
    error = refusal({"start": first})
    assert error.errors[0]["path"] == "payload.start.next.0"
    assert "cycle" in error.errors[0]["message"]


def test_very_deep_nesting_is_refused_cleanly_without_recursion() -> None:
    for make in (lambda inner: [inner], lambda inner: {"k": inner}):
        value: Any = None
        for _ in range(100_000):
            value = make(value)
        error = refusal(value)
        assert "deep" in error.errors[0]["message"]
        assert "levels deep" in str(error)
        assert error.errors[0]["path"].count(".") == MAX_DEPTH


def test_one_level_past_the_limit_is_refused() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        value = [value]
    assert "deep" in refusal(value).errors[0]["message"]


def test_a_million_ints_pass() -> None:
    # How fast is a benchmark's question; the per-test timeout only bounds a hang.
    jobrun.assert_queue_safe(list(range(1_000_000)), "payload")


def test_a_million_ints_with_one_bad_value_at_the_end() -> None:
    value: list[Any] = list(range(1_000_000))
    value.append(b"x")
    assert refused_path(value) == "payload.1000000"


def test_shared_sub_objects_are_not_walked_once_per_path() -> None:
    # 200 levels of [x, x] is 2**200 paths but only 200 distinct lists.
    value: list[Any] = []
    for _ in range(200):
        value = [value, value]
    # A walk per path would never end; the per-test timeout turns that hang into a failure.
    jobrun.assert_queue_safe(value, "payload")

    poisoned: list[Any] = [b"bad"]
    for _ in range(200):
        poisoned = [poisoned, poisoned]
    assert refused_path(poisoned) == "payload" + ".0" * 201

    past_the_limit: list[Any] = []
    for _ in range(MAX_DEPTH + 1):
        past_the_limit = [past_the_limit, past_the_limit]
    assert "deep" in refusal(past_the_limit).errors[0]["message"]


def test_a_shared_object_seen_shallow_then_deep_is_still_depth_checked() -> None:
    shared: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        shared = [shared]
    # At depth 1 the shared chain fits; under 10 more levels it does not.
    deeper: Any = shared
    for _ in range(10):
        deeper = [deeper]
    assert refused_path([shared, deeper]).startswith("payload.1" + ".0" * 10)


# --- properties ---------------------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=40,
)

unsafe_leaves = st.sampled_from(
    [
        b"bytes",
        bytearray(b"x"),
        (1, 2),
        {1},
        frozenset(),
        datetime(2026, 1, 1, tzinfo=UTC),
        Decimal("0.1"),
        uuid.UUID(int=5),
        Point(3),
        Plain(),
        _function,
        OrderedDict(),
        Colour.RED,
        Name("n"),
        math.nan,
        math.inf,
        -math.inf,
    ]
)


def positions(value: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Every place in ``value`` as (path, parent, key); the root has no parent."""
    found: list[tuple[str, Any, Any]] = [(path, None, None)]
    stack = [(value, path)]
    while stack:
        current, here = stack.pop()
        items = (
            enumerate(current)
            if isinstance(current, list)
            else current.items()
            if isinstance(current, dict)
            else ()
        )
        for key, item in items:
            found.append((f"{here}.{key}", current, key))
            stack.append((item, f"{here}.{key}"))
    return found


@PROPERTY_SETTINGS
@given(json_values)
def test_every_json_safe_value_passes_and_round_trips(value: Any) -> None:
    jobrun.assert_queue_safe(value, "payload")
    assert same_json_value(json.loads(encode_json(value)), value)


@PROPERTY_SETTINGS
@given(json_values, st.data())
def test_an_injected_unsafe_value_is_refused_at_its_position(
    value: Any, data: st.DataObject
) -> None:
    path, parent, key = data.draw(st.sampled_from(positions(value, "payload")))
    unsafe = data.draw(unsafe_leaves)
    if parent is None:
        value = unsafe
    else:
        parent[key] = unsafe
    error = refusal(value)
    assert error.errors[0]["path"] == path
    assert path in str(error)


@PROPERTY_SETTINGS
@given(json_values, st.data())
def test_an_injected_non_str_key_is_refused_at_its_position(
    value: Any, data: st.DataObject
) -> None:
    path, parent, key = data.draw(st.sampled_from(positions(value, "payload")))
    bad_key = data.draw(st.sampled_from([0, 1.5, None, True, (1,)]))
    if parent is None:
        value = {bad_key: "x"}
    else:
        parent[key] = {bad_key: "x"}
    assert refused_path(value) == f"{path}.{bad_key}"


@PROPERTY_SETTINGS
@given(json_values, st.data())
def test_an_injected_cycle_is_refused_where_it_closes(value: Any, data: st.DataObject) -> None:
    value = [value]  # make sure there is at least one container
    containers = []
    stack: list[tuple[Any, str, list[Any]]] = [(value, "payload", [])]
    while stack:
        current, here, chain = stack.pop()
        if isinstance(current, list | dict):
            chain = [*chain, current]
            containers.append((current, here, chain))
            items = enumerate(current) if isinstance(current, list) else current.items()
            stack.extend((item, f"{here}.{key}", chain) for key, item in items)
    container, here, chain = data.draw(st.sampled_from(containers))
    ancestor = data.draw(st.sampled_from(chain))
    if isinstance(container, list):
        container.append(ancestor)
        path = f"{here}.{len(container) - 1}"
    else:
        key = "\x00cycle"
        container[key] = ancestor
        path = f"{here}.{key}"
    error = refusal(value)
    assert error.errors[0]["path"] == path
    assert "cycle" in error.errors[0]["message"]


anything = st.recursive(
    json_leaves
    | st.binary(max_size=4)
    | st.floats()
    | st.decimals()
    | st.datetimes()
    | st.uuids()
    | st.fractions()
    | st.complex_numbers()
    | st.sampled_from([Colour.RED, Name("n"), Ratio(2.0), Plain(), _function]),
    lambda children: (
        st.lists(children, max_size=5)
        | st.tuples(children, children)
        | st.frozensets(st.integers(), max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.integers() | st.none(), children, max_size=5)
        | st.builds(OrderedDict, st.dictionaries(st.text(max_size=4), children, max_size=3))
    ),
    max_leaves=30,
)


@PROPERTY_SETTINGS
@given(anything)
def test_no_value_makes_the_check_crash(value: Any) -> None:
    refused: jobrun.JobValidationError | None = None
    try:
        jobrun.assert_queue_safe(value, "payload")
    except jobrun.JobValidationError as error:
        refused = error
    if refused is None:
        assert same_json_value(json.loads(encode_json(value)), value)
    else:
        assert len(refused.errors) == 1
        assert refused.errors[0]["path"].startswith("payload")
        assert refused.errors[0]["path"] in str(refused)


class _Holder:
    def method(self) -> None:
        return None


@pytest.mark.parametrize("function", [len, lambda: None, _Holder().method, [].append])
def test_every_kind_of_function_is_called_a_function(function: object) -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.assert_queue_safe({"f": function}, "payload")
    assert caught.value.errors == [
        {"path": "payload.f", "message": "a function cannot be stored and read back unchanged"}
    ]


def test_a_refusal_says_what_a_run_carries() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        jobrun.assert_queue_safe({"blob": b"x"}, "payload")
    assert str(caught.value) == (
        "payload is not queue-safe: payload.blob is a bytes; a run carries ids and "
        "configuration, not bytes, objects or functions"
    )


def test_a_lone_surrogate_is_refused_as_not_valid_unicode() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        encode_queue_safe({"text": "\ud800"}, "payload", 1000)
    assert str(caught.value).startswith(
        "payload is not queue-safe: payload is text with a lone surrogate (not valid Unicode);"
    )
    (entry,) = caught.value.errors
    assert entry["path"] == "payload"
    assert entry["message"].startswith("text with a lone surrogate (not valid Unicode) (")
    assert "surrogate" in entry["message"].split("(not valid Unicode) (", 1)[1]


def test_an_int_too_long_for_json_text_is_refused_as_such() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        encode_queue_safe({"n": 10**5000}, "payload", 10**6)
    assert "payload is a value JSON text cannot hold;" in str(caught.value)
    assert caught.value.errors[0]["message"].startswith("a value JSON text cannot hold (")


@pytest.mark.parametrize(
    "value",
    [["x" * 100, b"later"], ["ab"] * 10 + [b"later"], {"k" * 30: 0, "z": b"later"}],
    ids=["one long text", "many short texts", "a long key"],
)
def test_a_value_over_the_cap_is_refused_as_too_large_before_its_later_faults(value: Any) -> None:
    # The walk counts every text and key towards the cap and stops there: an
    # unsafe value past it is never reached.
    with pytest.raises(jobrun.JobValidationError) as caught:
        encode_queue_safe(value, "payload", 20)
    (entry,) = caught.value.errors
    assert entry["path"] == "payload"
    assert entry["message"].endswith("is too large to carry")


def test_an_unsafe_value_within_the_cap_says_it_cannot_be_read_back() -> None:
    with pytest.raises(jobrun.JobValidationError) as caught:
        encode_queue_safe({"blob": b"x"}, "payload", 1000)
    assert caught.value.errors == [
        {"path": "payload.blob", "message": "a bytes cannot be stored and read back unchanged"}
    ]
