"""What a handler and its steps hand back, and the mistakes in it that fail a run at once.

A mistake here (a forgotten ``return``, ``done=1``, a typo in a key, a step
result JSON cannot hold) would fail the same way on every retry, so it is a
:class:`~jobrun.errors.HandlerMistakeError`: the run ends ``failed`` on that
pass, with a ``last_error`` that says what to fix.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from jobrun._core.model.formats import OverCapError, encode_json_within
from jobrun._core.model.queue_safety import encode_queue_safe
from jobrun._core.model.refusals import as_mistake, mistake
from jobrun.errors import HandlerMistakeError, JobValidationError


class _Keep:
    """Marker for "keep the committed cursor" (a cursor of ``None`` commits JSON null)."""

    _instance: _Keep | None = None

    def __new__(cls) -> _Keep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "KEEP_CURSOR"


KEEP_CURSOR: Final = _Keep()
"""The default cursor of :class:`PassResult`: commit the cursor the pass started with.

A pass that returns ``PassResult(done=False)`` without a cursor is therefore
called again with the same cursor (useful while polling for something). To
store JSON ``null`` as the cursor, pass ``cursor=None`` explicitly.
"""


@dataclass(frozen=True, slots=True)
class PassResult:
    """What a handler hands back at the end of a pass.

    ``cursor`` is where the next pass starts (any queue-safe JSON value: numbers,
    strings, lists, dicts, ``None``, within the store's cursor cap); leave it out
    to keep the committed one (``None`` commits JSON null). ``done=True`` ends
    the run as ``done``; it must be a real ``bool``. The cursor and the pass's
    counters are committed together, in one transaction, and the step ledger is
    dropped with them. A mapping with only the keys ``"cursor"`` and ``"done"``
    means the same. Returning ``None`` (a forgotten ``return``) fails the run at once.
    """

    cursor: Any = KEEP_CURSOR
    done: bool = False


HandlerResult: TypeAlias = PassResult | Mapping[str, Any]

_RESULT_HELP = (
    "return PassResult(cursor=..., done=...) or a dict with only 'cursor' and 'done' "
    "(PassResult() keeps the cursor and goes on)"
)


def _type_name(value: object) -> str:
    """The type with its article: ``an int``, ``a numpy.bool``."""
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def refuse_generator(result: object) -> None:
    """A handler written as a generator is a mistake, found before anything awaits it.

    A generator marked awaitable (``types.coroutine``) would otherwise be awaited
    and fail with asyncio's "Task got bad yield" on every retry.
    """
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        if inspect.isgenerator(result):
            # Never started, so closing runs none of its code; it just cannot linger.
            result.close()
        raise mistake(
            "result",
            _type_name(result),
            message=f"the handler returned {_type_name(result)}: a handler is a plain or "
            f"`async def` function without `yield`; {_RESULT_HELP}",
        )


def interpret_result(result: object) -> tuple[Any, bool]:
    """``(cursor or KEEP_CURSOR, done)`` from what a handler returned, or a mistake."""
    if result is None:
        raise mistake(
            "result",
            "None",
            message=f"the handler returned None: did you forget `return`? {_RESULT_HELP}",
        )
    if isinstance(result, PassResult):
        cursor, done = result.cursor, result.done
    elif isinstance(result, Mapping):
        unknown = sorted(repr(key) for key in result if key not in ("cursor", "done"))
        if unknown:
            raise mistake(
                "result",
                f"unknown key(s) {', '.join(unknown)}",
                message=f"the handler returned unknown key(s) {', '.join(unknown)}: "
                "a pass result has only 'cursor' and 'done' (a typo?)",
            )
        cursor, done = result.get("cursor", KEEP_CURSOR), result.get("done", False)
    else:
        if inspect.iscoroutine(result):
            # Awaited by nobody: closed, so Python does not warn about it later.
            result.close()
        raise mistake(
            "result",
            _type_name(result),
            message=f"the handler returned {_type_name(result)}: {_RESULT_HELP}",
        )
    if type(done) is not bool:
        raise mistake(
            "result.done",
            _type_name(done),
            message=f"the handler returned done={done!r} ({_type_name(done)}): done must be True "
            "or False; write done=bool(...) if it comes from elsewhere",
        )
    return cursor, done


def cursor_text(cursor: Any, max_bytes: int) -> str:
    """The cursor's JSON, or a mistake naming the unsafe place in it."""
    try:
        return encode_queue_safe(cursor, "cursor", max_bytes)
    except HandlerMistakeError:
        raise
    except JobValidationError as error:
        raise as_mistake(
            error, f"the handler returned a cursor that cannot be stored: {error.message}"
        ) from error


def counters_text(counters: Mapping[str, int | float], max_bytes: int) -> str:
    """The counters' JSON, or a mistake when they are over the cap."""
    try:
        return encode_json_within(dict(counters), max_bytes)
    except OverCapError as error:
        raise mistake(
            "counters",
            str(error),
            message=f"the counters are {error}: p.count() is for a few totals, "
            "not one counter per item (put per-item results in steps or the cursor)",
        ) from error


def step_result_text(step: str, value: Any, max_bytes: int) -> str:
    """A step's result as JSON, or a mistake: the body ran, and must not run again for it."""
    try:
        return encode_json_within(value, max_bytes)
    except OverCapError as error:
        what = str(error)
    except (TypeError, ValueError, RecursionError) as error:
        # json names the type ("Object of type set is not JSON serializable").
        what = f"not JSON ({error})"
    if isinstance(value, float) and not math.isfinite(value):
        what = f"{value!r}, which JSON cannot store"
    raise mistake(
        f"step.{step}",
        what,
        message=f"step {step!r} returned a value that cannot be stored: {what}. Return JSON data "
        "(dict with str keys, list, str, int, finite float, bool, None) within the cap; "
        "the body ran once and is not run again until the run is resumed",
    )
