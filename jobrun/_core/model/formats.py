"""Stored formats: timestamps and JSON text.

Timestamps are stored as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` text because due-ness is
decided by comparing strings in SQL; that is only sound when every value has
exactly this shape (UTC, three fractional digits, a literal ``Z``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from jobrun._core.model.fast_json import plain_text
from jobrun._core.model.refusals import is_number, refuse


def format_instant(moment: datetime) -> str:
    """Render an aware datetime as stored text, milliseconds truncated."""
    utc = moment
    if moment.tzinfo is not UTC:  # every step stamps one: skip the conversion when it is UTC
        if moment.tzinfo is None:
            raise refuse(
                "timestamp",
                "must be timezone-aware",
                message=f"timestamps must be timezone-aware, got naive {moment!r}",
            )
        utc = moment.astimezone(UTC)
    # Not strftime: its %Y does not zero-pad years before 1000 on glibc. %-formatting
    # is about twice as fast as the f-string with seven format specs.
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031
        utc.year,
        utc.month,
        utc.day,
        utc.hour,
        utc.minute,
        utc.second,
        utc.microsecond // 1000,
    )


def parse_instant(text: str) -> datetime:
    """Read stored timestamp text back as an aware UTC datetime.

    Lenient on purpose (any ISO-8601 form Python reads), so a row written by
    another tool is still readable; naive values are taken as UTC.
    """
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def add_milliseconds(instant_text: str, delay_ms: float) -> str:
    """The stored instant ``delay_ms`` after another, fractional ms truncated."""
    return format_instant(parse_instant(instant_text) + timedelta(milliseconds=int(delay_ms)))


def encode_json(value: Any) -> str:
    """Compact JSON text: no spaces, UTF-8 kept, NaN and Infinity refused."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class OverCapError(ValueError):
    """A value's JSON is larger than the cap it must fit."""

    def __init__(self, max_bytes: int, size: int) -> None:
        # ``size`` is what was encoded when the cap was passed: a lower bound, since
        # encoding stops there rather than expanding a huge value in full.
        super().__init__(f"at least {size} bytes of JSON, over the {max_bytes}-byte cap")


def _float_text(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not JSON")  # as allow_nan=False says it
    return float.__repr__(value)


# What json itself writes for these exact types (subclasses, an IntEnum say, take
# the general path); each decodes back to an equal value of the same type.
_SCALAR_TEXT: dict[type, Callable[[Any], str]] = {
    int: int.__repr__,
    str: json.encoder.encode_basestring,
    float: _float_text,
    bool: lambda value: "true" if value else "false",
    type(None): lambda _value: "null",
}
JSON_SCALARS = frozenset(_SCALAR_TEXT)
"""Exact types whose JSON decodes to an equal value of the same type (finite floats)."""


def encode_json_within(value: Any, max_bytes: int) -> str:
    """``encode_json``, stopped as soon as the text passes ``max_bytes`` of UTF-8.

    Encoding piece by piece matters: a value that shares one sub-list many times
    is small in memory but can expand to gigabytes of text.
    """
    scalar = _SCALAR_TEXT.get(type(value))
    if scalar is not None:
        # A scalar's text is at most a few times its own size: written whole (the
        # common step result, at a tenth of the piecewise path's cost).
        text = scalar(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > max_bytes:
            raise OverCapError(max_bytes, size)
        return text
    # A plain value (most are) in one call, byte for byte the same (fast_json.py).
    whole = plain_text(value, max_bytes)
    if whole is not None:
        return whole
    chunks: list[str] = []
    size = 0
    for chunk in _ENCODER.iterencode(value):
        chunks.append(chunk)
        size += len(chunk.encode("utf-8"))
        if size > max_bytes:
            raise OverCapError(max_bytes, size)
    return "".join(chunks)


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not portable JSON")


def _finite_float(token: str) -> float:
    number = float(token)
    if not math.isfinite(number):
        raise ValueError(f"{token} does not fit a finite float")
    return number


def decode_json(text: str, column: str) -> Any:
    """Decode one stored JSON column; the error names the column and says JSON."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError, TypeError) as error:
        raise MalformedColumnError(column, error) from error


def is_count(value: object) -> bool:
    """A counter's value: an int or float that is a finite float (an int past
    ~1.8e308 is not: ``math.isfinite`` cannot even take it)."""
    if not is_number(value):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def decode_counters(text: str) -> dict[str, int | float]:
    """Counters must be an object of finite numbers; anything else is malformed."""
    value = decode_json(text, "counters")
    if not isinstance(value, dict):
        raise MalformedColumnError(
            "counters", ValueError(f"expected an object of numbers, got {type(value).__name__}")
        )
    for name, number in value.items():
        if not is_count(number):
            raise MalformedColumnError(
                "counters", ValueError(f"counter {name!r} is {number!r}, not a finite number")
            )
    return dict(value)


def repaired_counters(text: str) -> str | None:
    """Malformed counters made sound, or ``None`` when they already are.

    What can be kept is kept: from an object, every entry that is a finite
    number; anything else (not JSON, not an object) becomes ``{}``.
    """
    try:
        decode_counters(text)
    except MalformedColumnError:
        pass
    else:
        return None
    try:
        value = decode_json(text, "counters")
    except MalformedColumnError:
        return "{}"
    if not isinstance(value, dict):
        return "{}"
    return encode_json({name: number for name, number in value.items() if is_count(number)})


class MalformedColumnError(ValueError):
    """A stored JSON column could not be decoded."""

    def __init__(self, column: str, cause: BaseException) -> None:
        super().__init__(f"{column} is not valid JSON: {cause}")
        self.column = column
