"""One way to refuse bad input: every refusal jobrun raises is made here.

A refusal is a :class:`~jobrun.errors.JobValidationError` (a ``ValueError``)
whose ``errors`` name the input (``path``, dotted from the argument's name) and
what is wrong with it (``problem``); its message reads ``"<path> <problem>"``
unless a sentence of its own reads better. An input of the wrong *type* is an
:class:`~jobrun.errors.ArgumentTypeError`, which is also a ``TypeError``, so
``except TypeError`` written for older versions still catches it. A mistake in
a handler's use of the pass (found during a pass, failing the run at once) is a
:class:`~jobrun.errors.HandlerMistakeError`, made by :func:`mistake`.

The checks that recur (an int that is not a ``bool``, a positive count, a
number of seconds, a str) are here too, once; ``tests/unit/model/test_refusals.py``
fails when a refusal or such a check is spelled anywhere else in ``jobrun/``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TypeGuard

from jobrun.errors import ArgumentTypeError, HandlerMistakeError, JobValidationError


def refuse(path: str, problem: str, *, message: str | None = None) -> JobValidationError:
    """The error for one refused input: ``path`` names it, ``problem`` says what is wrong."""
    text = f"{path} {problem}" if message is None else message
    return JobValidationError(text, [{"path": path, "message": problem}])


def refuse_type(path: str, problem: str, *, message: str | None = None) -> ArgumentTypeError:
    """:func:`refuse` for an input of the wrong type (also a ``TypeError``)."""
    text = f"{path} {problem}" if message is None else message
    return ArgumentTypeError(text, [{"path": path, "message": problem}])


def mistake(path: str, problem: str, *, message: str | None = None) -> HandlerMistakeError:
    """A mistake in handler code (the run fails at once); its message is the
    ``problem`` itself (a sentence about the handler's code) unless given."""
    return HandlerMistakeError(
        problem if message is None else message, [{"path": path, "message": problem}]
    )


def as_mistake(error: JobValidationError, message: str) -> HandlerMistakeError:
    """A refusal of a value the handler handed back, as the handler's mistake."""
    return HandlerMistakeError(message, error.errors)


def type_name(value: object) -> str:
    return type(value).__name__


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int``; a ``bool``, which Python counts as one, is not."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or a ``float`` (a ``bool`` is neither here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def checked_int(
    value: object,
    path: str,
    *,
    wanted: str = "an int",
    subject: str | None = None,
    show_value: bool = False,
) -> int:
    """``value`` if it is an ``int`` (a ``bool`` is not one here); else
    "<subject> must be <wanted>, got <type>" (and the value, with ``show_value``)."""
    if not is_int(value):
        got = f"{type_name(value)} {value!r}" if show_value else type_name(value)
        problem = f"must be {wanted}, got {got}"
        raise refuse_type(path, problem, message=f"{subject or path} {problem}")
    return value


def checked_count(value: object, path: str) -> int:
    """``value`` if it is an ``int`` of at least 1."""
    count = checked_int(value, path, show_value=True)
    if count < 1:
        raise refuse(path, f"must be at least 1, got {count!r}")
    return count


def checked_positive_int(value: object, path: str) -> int:
    """``value`` if it is an ``int`` of at least 1, one message for every refusal."""
    problem = f"must be a positive int, got {value!r}"
    if not is_int(value):
        raise refuse_type(path, problem)
    if value < 1:
        raise refuse(path, problem)
    return value


def checked_number(value: object, path: str, *, wanted: str, show_value: bool = False) -> float:
    """``value`` if it is an ``int`` or a ``float`` (not a ``bool``); else
    "<path> must be <wanted>, got <type>"."""
    if not is_number(value):
        got = f"{type_name(value)} {value!r}" if show_value else type_name(value)
        raise refuse_type(path, f"must be {wanted}, got {got}")
    return value


def checked_seconds(value: object, path: str) -> float:
    """``value`` as a float if it is a finite, positive number of seconds."""
    seconds = checked_number(value, path, wanted="a number of seconds", show_value=True)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise refuse(path, f"must be a positive, finite number of seconds, got {value!r}")
    return float(seconds)


def checked_str(
    value: object, path: str, *, wanted: str = "a str", subject: str | None = None
) -> str:
    """``value`` if it is a ``str``; else "<subject> must be <wanted>, got <type>"."""
    if not isinstance(value, str):
        problem = f"must be {wanted}, got {type_name(value)}"
        raise refuse_type(path, problem, message=f"{subject or path} {problem}")
    return value


def checked_bool(value: object, path: str) -> bool:
    """``value`` if it is ``True`` or ``False`` (not merely truthy)."""
    if not isinstance(value, bool):
        raise refuse_type(path, f"must be True or False, got {value!r}")
    return value


def checked_callable(value: object, path: str, what: str) -> None:
    """Nothing if ``value`` is ``None`` or callable; else "<path> must be <what>"."""
    if value is not None and not callable(value):
        raise refuse_type(path, f"must be {what}, got {type_name(value)}")


def in_item(error: JobValidationError, path: str) -> JobValidationError:
    """``error``, raised for one item of a list argument, as refused at ``path``
    (``starts[3]``): the same type, its message and every error's path prefixed."""
    errors = [{**entry, "path": f"{path}.{entry['path']}"} for entry in error.errors]
    return type(error)(f"{path}: {error.message}", errors)


def checked_aware(value: object, path: str) -> datetime:
    """``value`` if it is a timezone-aware ``datetime``; a naive one is refused, since
    it could mean any of the world's local times."""
    if not isinstance(value, datetime):
        raise refuse_type(path, f"must be an aware datetime, got {type_name(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise refuse(
            path,
            "must be timezone-aware",
            message=f"{path} must be timezone-aware (e.g. tzinfo=UTC), got naive {value!r}",
        )
    return value


def checked_delay(value: object, path: str) -> float:
    """``value`` as a float if it is a finite number of seconds, zero or more."""
    seconds = checked_number(value, path, wanted="a number of seconds", show_value=True)
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise refuse(path, f"must be a finite number of seconds, 0 or more, got {value!r}")
    return float(seconds)
