"""Plain JSON values written in one call, byte for byte as json writes them.

``encode_json_within`` (``formats.py``) writes a container piece by piece with
json's pure-Python encoder, so that a value sharing one sub-list many times
cannot expand to gigabytes of text before the cap stops it. Most values are
plain: dicts with str keys, lists and tuples, strings, ints, floats, bools and
None, a few levels deep. For those, a walk that counts the nodes proves the
text bounded (each node writes at least one byte: more nodes than the cap has
bytes is over the cap), and the text is then written in one call: by orjson
when it is installed (the ``speed`` extra) and the value holds nothing orjson
writes differently from json (a float: orjson writes ``1e-05`` as ``0.00001``;
an int past 64 bits; a key that is not a str), else by json's own C encoder.
Either way the text is the one json writes with jobrun's settings, byte for
byte (``tests/unit/model/test_fast_json.py`` checks both paths against it): the
stored format does not depend on what is installed. Anything else, and every
error or text over the cap, goes back to the piecewise path, so refusals and
their messages are as they were.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from typing import Any

_orjson: Any
try:
    # By name: optional, and typed or not wherever it is installed.
    _orjson = importlib.import_module("orjson")
except ImportError:
    _orjson = None

_ONE_SHOT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# Deeper values take the piecewise path (orjson stops at 255 levels, json's C
# encoder at the recursion limit, each with its own error).
MAX_DEPTH = 64
_INT_RANGE = range(-(2**63), 2**64)  # the ints orjson writes (as json does)
_CONTAINERS = (dict, list, tuple)
_SAFE_CONTAINERS = (dict, list)  # a tuple is not queue-safe
# A run of 19 digits: maybe an int past 64 bits, which orjson.loads would make a float.
_LONG_NUMBER = re.compile(r"\d{19}")


def accelerator() -> str:
    """What writes plain values here: ``"orjson"`` or ``"json"`` (its C encoder)."""
    return "json" if _orjson is None else "orjson"


def plain_text(value: Any, max_bytes: int) -> str | None:
    """``value``'s JSON written in one call when it is plain and within ``max_bytes``
    of UTF-8; ``None`` for everything else (the caller's piecewise path)."""
    if type(value) not in _CONTAINERS:
        return None
    orjson_writes_alike = _walk(value, max_bytes)
    if orjson_writes_alike is None:
        return None
    return _written(value, orjson_writes_alike, max_bytes)


def _written(value: Any, orjson_writes_alike: bool, max_bytes: int) -> str | None:
    """``value``'s JSON in one call (orjson's where it writes it as json does), or
    ``None`` when the encoder refuses it or it is over ``max_bytes`` of UTF-8."""
    try:
        if orjson_writes_alike and _orjson is not None:
            text: str = _orjson.dumps(value).decode("utf-8")
        else:
            text = _ONE_SHOT.encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        # A non-finite float, a lone surrogate: refused by the piecewise path, in its words.
        return None
    return text if size <= max_bytes else None


def _walk(
    value: Any, most_nodes: int, containers: tuple[type, ...] = _CONTAINERS, safe: bool = False
) -> bool | None:
    """Whether ``value`` is plain (``None``: not, or more nodes than ``most_nodes``),
    and if so whether orjson writes it exactly as json does. Only ``containers``
    nest; ``safe`` also refuses what the queue-safety check would: a key that is
    not a str, a float that is not finite."""
    alike = True
    nodes = 1
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        container, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return None
        nodes += len(container)
        if nodes > most_nodes:
            # Also where a cycle ends: it would count nodes for ever.
            return None
        if type(container) is dict:
            for key in container:
                if type(key) is not str:
                    # json writes int, float, bool and None keys as strings; orjson refuses them.
                    if safe or not (key is None or type(key) in (int, float, bool)):
                        return None
                    alike = False
            children: Any = container.values()
        else:
            children = container
        for child in children:
            kind = type(child)
            if kind is str or kind is bool or child is None:
                continue
            if kind is int:
                alike = alike and child in _INT_RANGE
            elif kind is float:
                if safe and not math.isfinite(child):
                    return None
                alike = False
            elif kind in containers:
                stack.append((child, depth + 1))
            else:
                return None
    return alike


def queue_safe_text(value: Any, max_bytes: int) -> str | None:
    """``value``'s JSON when a single walk proves it queue-safe (``queue_safety.py``:
    exact types, str keys, finite floats) and plain, within ``max_bytes``; ``None``
    for anything else, which the caller checks and writes the long way (the same
    text when it is safe, the refusal in its words when not). One walk where a
    start took two: the check's and the writer's."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return None
    alike = _walk(value, max_bytes, _SAFE_CONTAINERS, safe=True)
    if alike is None:
        return None
    return _written(value, alike, max_bytes)


def loads_own(text: str) -> Any:
    """Decode JSON text jobrun wrote (``json``'s settings): by orjson when installed
    and every number fits 64 bits, else by json; the same value either way."""
    if _orjson is not None and _LONG_NUMBER.search(text) is None:
        return _orjson.loads(text)
    return json.loads(text)
