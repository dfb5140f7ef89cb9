"""Queue-safety: a payload or cursor must come back from storage exactly as it went in.

A run outlives the process that started it, so what it carries is stored as JSON
and decoded by whichever process runs the next pass. Only values that survive
that trip unchanged are accepted: ``None``, ``bool``, ``int``, finite ``float``,
``str``, ``list`` and ``dict`` with ``str`` keys, by exact type. A tuple would
come back a list, a datetime would not come back at all; both are refused rather
than silently reshaped.
"""

from __future__ import annotations

import math
from typing import Any

from jobrun._core.model.fast_json import queue_safe_text
from jobrun._core.model.formats import OverCapError, encode_json_within
from jobrun._core.model.refusals import refuse
from jobrun.errors import JobValidationError

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
"""The default bound on a stored payload and cursor (a store may set another)."""

MAX_DEPTH = 256
"""Deeper nesting is refused: it would also defeat the JSON decoder on replay."""

_LEAF_TYPES = (type(None), bool, int, str)


class _BadKey:
    """Stands, in walk order, for a dict key that is not a ``str``."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def _describe(value: Any) -> str:
    kind = type(value)
    if kind is float:
        return f"{value!r}, which JSON cannot store"
    if callable(value) and kind.__name__ in {"function", "builtin_function_or_method", "method"}:
        return "a function"
    for base in (dict, list, str, int, float):
        if isinstance(value, base):
            return f"a {kind.__name__} (a {base.__name__} subclass)"
    return f"a {kind.__name__}"


def _least_json_bytes(value: Any, kind: type) -> int:
    """A lower bound of the JSON bytes ``value`` adds, before its children (O(1))."""
    if kind is str:
        return len(value) + 2
    # Containers: their punctuation only; each element is counted when visited.
    if kind is list:
        # Brackets and the commas between elements.
        return len(value) + 1
    if kind is dict:
        # Braces, commas, and ``"":`` per entry (the key texts are counted as visited).
        return 4 * len(value) + 1
    return 1


def queue_safety_problem(
    value: Any, root: str, max_bytes: int | None = None
) -> tuple[str, str] | None:
    """The first unsafe place in ``value`` as ``(path, what)``, or ``None``.

    Depth first, in list and insertion order. Iterative, so no nesting or size can
    exhaust the Python stack; cycles are detected on the ancestor chain only (a
    sub-object shared by two siblings is fine). With ``max_bytes`` the walk
    keeps a lower bound of the value's JSON size and raises
    :class:`OverCapError` as soon as it passes the cap, so a huge value costs
    time in proportion to the cap, not to its own size.
    """
    least_bytes = 0
    # Stack entries: (value, path, depth) to visit, or (container, path, -1 - depth)
    # to leave a container: drop it from the ancestor chain and remember that its
    # whole subtree passed at that depth, so a shared sub-object is walked once per
    # depth rather than once per path (a DAG of doubling lists would be exponential).
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    ancestors: set[int] = set()
    passed_at_depth: dict[int, int] = {}
    while stack:
        current, path, depth = stack.pop()
        if depth < 0:
            ancestors.discard(id(current))
            passed_at_depth[id(current)] = max(passed_at_depth.get(id(current), -1), -1 - depth)
            continue
        kind = type(current)
        if max_bytes is not None:
            least_bytes += _least_json_bytes(current, kind)
            if least_bytes > max_bytes:
                raise OverCapError(max_bytes, least_bytes)
        if kind in _LEAF_TYPES:
            continue
        if kind is _BadKey:
            return path, f"a {type(current.key).__name__} key (keys must be str)"
        if kind is float:
            if math.isfinite(current):
                continue
            return path, _describe(current)
        if kind is not list and kind is not dict:
            return path, _describe(current)
        if id(current) in ancestors:
            return path, "a cycle back to a value already on this path"
        if passed_at_depth.get(id(current), -1) >= depth:
            continue
        if depth >= MAX_DEPTH:
            return path, f"nested more than {MAX_DEPTH} levels deep"
        ancestors.add(id(current))
        stack.append((current, path, -1 - depth))
        if kind is list:
            children = [(item, f"{path}.{index}", depth + 1) for index, item in enumerate(current)]
        else:
            children, key_bytes = _entries(current, path, depth + 1)
            least_bytes += key_bytes
        stack.extend(reversed(children))
    return None


def _entries(
    mapping: dict[Any, Any], path: str, depth: int
) -> tuple[list[tuple[Any, str, int]], int]:
    """A dict's values to visit, up to the first key that is not a ``str``; its keys' length."""
    children: list[tuple[Any, str, int]] = []
    key_bytes = 0
    for key, item in mapping.items():
        if type(key) is not str:
            # Reported when the walk reaches it, after earlier siblings' subtrees.
            children.append((_BadKey(key), f"{path}.{key}", depth))
            break
        children.append((item, f"{path}.{key}", depth))
        key_bytes += len(key)
    return children, key_bytes


def assert_queue_safe(value: Any, root: str) -> None:
    """Raise :class:`JobValidationError` at the first value that would not survive storage."""
    problem = queue_safety_problem(value, root)
    if problem is not None:
        path, what = problem
        raise _not_queue_safe(root, path, what, "cannot be stored and read back unchanged")


def encode_queue_safe(value: Any, root: str, max_bytes: int) -> str:
    """Check ``value``, encode it, and refuse it when the JSON is over ``max_bytes``."""
    # Most payloads are plain and small: checked and written in one walk.
    text = queue_safe_text(value, max_bytes)
    if text is not None:
        return text
    try:
        problem = queue_safety_problem(value, root, max_bytes)
        text = None if problem is not None else encode_json_within(value, max_bytes)
    except OverCapError as error:
        # Both numbers go into the message itself, not only into ``errors``.
        raise _not_queue_safe(root, root, str(error), "is too large to carry") from error
    except UnicodeEncodeError as error:
        # What Python makes of non-UTF-8 bytes: no backend can store it.
        raise _not_queue_safe(
            root, root, "text with a lone surrogate (not valid Unicode)", f"({error})"
        ) from error
    except ValueError as error:
        # Python refuses to print ints of more than 4300 digits.
        raise _not_queue_safe(root, root, "a value JSON text cannot hold", f"({error})") from error
    if problem is not None:
        path, what = problem
        raise _not_queue_safe(root, path, what, "cannot be stored and read back unchanged")
    assert text is not None
    return text


def _not_queue_safe(root: str, path: str, what: str, why: str) -> JobValidationError:
    """The refusal of a value that is not queue-safe at ``path``: ``what`` it is, and ``why``."""
    return refuse(
        path,
        f"{what} {why}",
        message=f"{root} is not queue-safe: {path} is {what}; a run carries ids and "
        "configuration, not bytes, objects or functions",
    )
