"""What a key part or step name may be: a ``str`` every backend stores exactly."""

from __future__ import annotations

from jobrun.errors import JobValidationError


def require_name(value: object, argument: str, *, allow_empty: bool = False) -> str:
    """Refuse a non-``str``, an empty name (unless allowed) and a NUL character.

    NUL is refused everywhere because Postgres text cannot hold it: a name that
    works on SQLite must not fail on Postgres later.
    """
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if not value and not allow_empty:
        raise JobValidationError(
            f"{argument} must not be empty", [{"path": argument, "message": "empty string"}]
        )
    if "\x00" in value:
        raise JobValidationError(
            f"{argument} must not contain a NUL character (Postgres cannot store it)",
            [{"path": argument, "message": "contains NUL"}],
        )
    return value
