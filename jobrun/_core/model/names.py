"""The one rule for names (module id, job, instance, step), the same on every backend.

A name is a ``str`` of valid Unicode (no lone surrogate, which is what Python
makes of non-UTF-8 bytes in ``sys.argv``), without NUL (Postgres text cannot
hold it), of at most :data:`MAX_NAME_BYTES` bytes of UTF-8. The byte limit keeps
a row of the key index (module id, job, instance and the 26-character id) far
below the ~2,700 bytes a Postgres btree entry may take, so a name SQLite stores
is a name Postgres stores too.
"""

from __future__ import annotations

from jobrun._core.model.refusals import checked_str, refuse

MAX_NAME_BYTES = 512


def name_problem(value: str, *, allow_empty: bool = False) -> str | None:
    """What is wrong with a ``str`` as a name, or ``None`` when it is a good one."""
    if not value:
        return None if allow_empty else "is empty"
    if "\x00" in value:
        return "contains a NUL character (Postgres cannot store it)"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as error:
        return (
            f"is not valid Unicode: a lone surrogate at character {error.start} "
            "(text decoded from non-UTF-8 bytes?)"
        )
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes of UTF-8, over the {MAX_NAME_BYTES}-byte limit for names"
    return None


def text_problem(value: str) -> str | None:
    """What makes free text (a reason, a filter) unstorable: a lone surrogate or a NUL."""
    if "\x00" in value:
        return "contains a NUL character (Postgres cannot store it)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"is not valid Unicode: a lone surrogate at character {error.start}"
    return None


def require_name(value: object, argument: str, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a good name; else a refusal naming ``argument``
    (:class:`~jobrun.errors.ArgumentTypeError` for a value that is not a str)."""
    name = checked_str(value, argument)
    problem = name_problem(name, allow_empty=allow_empty)
    if problem is not None:
        raise refuse(argument, problem, message=f"{argument} {shown_name(name)} {problem}")
    return name


def require_text(value: str, argument: str) -> str:
    """Return ``value`` if it can be stored as text on every backend."""
    problem = text_problem(value)
    if problem is not None:
        raise refuse(argument, problem, message=f"{argument} {shown_name(value)} {problem}")
    return value


def shown_name(value: str) -> str:
    """A short, printable rendering of a refused value (it may be huge or unprintable)."""
    shown = ascii(value[:40])
    return shown if len(value) <= 40 else f"{shown[:-1]}...{shown[-1]}"
