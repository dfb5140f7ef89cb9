"""Failures grouped by what went wrong: the error's type and its message with the
particulars (numbers, ids, hashes) taken out, so a thousand runs that failed on
"order 4411 not found" and "order 97 not found" read as one line to act on.

``last_error`` holds ``Type: message`` (see ``jobrun.errors.describe_exception``);
a text without a type reads as type ``"?"``. Only the first line counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from jobrun._core.model.records import RunRow

MESSAGE_CHARS = 300
"""A normalised message is cut here: groups differ in what comes first."""

_TYPE = re.compile(r"\A([A-Za-z_][\w.]*): ?(.*)\Z", re.DOTALL)
# Most specific first: a UUID or ULID would otherwise be read as numbers and letters.
_PARTICULARS = (
    (re.compile(r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "<id>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\d+(?:[.,]\d+)*"), "<n>"),
)


def error_signature(last_error: str | None) -> tuple[str, str]:
    """``(type, message)`` of a stored error with numbers, ids and hashes normalised
    away (``<n>``, ``<id>``, ``<hex>``) and whitespace squeezed."""
    text = (last_error or "").strip()
    first_line = text.splitlines()[0] if text else ""
    found = _TYPE.match(first_line)
    error_type, message = (found.group(1), found.group(2)) if found else ("?", first_line)
    for pattern, stand_in in _PARTICULARS:
        message = pattern.sub(stand_in, message)
    message = " ".join(message.split())
    return error_type, message[:MESSAGE_CHARS]


@dataclass(slots=True)
class ErrorGroup:
    """Failed runs sharing one signature: how many, the newest ids (up to the cap the
    grouping was given), the jobs they belong to, and the latest failure."""

    error_type: str
    message: str
    count: int = 0
    run_ids: list[str] = field(default_factory=list)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    last_ended_at: str = ""
    example: str = ""


def group_errors(rows: Iterable[RunRow], keep_ids: int) -> list[ErrorGroup]:
    """``rows`` (failed runs, any order) grouped by :func:`error_signature`, the
    largest group first (ties: the latest failure first); each keeps its
    ``keep_ids`` newest run ids."""
    groups: dict[tuple[str, str], ErrorGroup] = {}
    for row in sorted(rows, key=lambda each: each.id, reverse=True):
        signature = error_signature(row.last_error)
        group = groups.get(signature)
        if group is None:
            group = groups[signature] = ErrorGroup(*signature, example=row.last_error or "")
        group.count += 1
        if len(group.run_ids) < keep_ids:
            group.run_ids.append(row.id)
        group.jobs.add((row.module_id, row.job))
        group.last_ended_at = max(group.last_ended_at, row.ended_at or "")
    return sorted(
        groups.values(), key=lambda group: (-group.count, _descending(group.last_ended_at))
    )


def _descending(text: str) -> tuple[int, ...]:
    return tuple(-ord(character) for character in text)
