"""Versioned jobs: a job's code changes while its runs are in flight.

A job registered with ``version=N`` (unversioned: 1) names one upgrade function
per older version, ``upgrade={1: f1, ..., N-1: fN_1}``, each a plain synchronous
function from a cursor of its version to a cursor of the next. A run stores the
version of the code that last committed it (NULL: 1,
:func:`jobrun._core.model.predicates.stored_version`).

* The claim never gives a driver a run whose stored version is newer than its
  code's (:func:`jobrun._core.model.predicates.runnable_by`): after a rollback such
  runs wait, and health shows them (:func:`runs_beyond_code`).
* A pass of newer code first upgrades the stored cursor through each function in
  order (:func:`upgraded_cursor`) and, before the handler runs, writes it with the
  new version and drops the older code's ledger, in one fenced transaction
  (:func:`upgrade_run`): a memo of an older version's step never answers a step
  of the new code, and a failed pass after it keeps the new code's own ledger.
  An upgrade function that raises fails the pass like any failed attempt.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from jobrun._core.model.refusals import checked_int, is_int, mistake, refuse, refuse_type, type_name

Upgrade: TypeAlias = Callable[[Any], Any]
"""One upgrade function: a cursor of version ``v`` in, a cursor of ``v + 1`` out."""


def checked_version(version: object) -> int:
    """A job's version: an int of at least 1 (not a bool)."""
    checked = checked_int(version, "version", show_value=True)
    if checked < 1:
        raise refuse("version", f"must be at least 1, got {checked}")
    return checked


def _not_plain(function: object) -> str | None:
    """Why ``function`` is not a plain synchronous function, or ``None`` if it is one."""
    if not callable(function):
        return f"is not callable (got {type_name(function)})"
    if inspect.iscoroutinefunction(function):
        return "is an `async def` function"
    if inspect.isasyncgenfunction(function):
        return "is an async generator function"
    if inspect.isgeneratorfunction(function):
        return "is a generator function"
    return None


def checked_upgrades(version: int, upgrade: object) -> tuple[Upgrade, ...]:
    """The upgrade functions of a job of ``version``, in order (the first upgrades
    version 1): ``upgrade`` must map exactly ``1 .. version - 1`` to plain
    synchronous functions (``None`` or empty only for version 1)."""
    given: Mapping[Any, Any] = {} if upgrade is None else _mapping(upgrade)
    wanted = set(range(1, version))
    stray = [key for key in given if not (is_int(key) and key in wanted)]
    if stray:
        shown = ", ".join(repr(key) for key in stray)
        raise refuse(
            "upgrade",
            f"has keys {shown} that are no older version of this version-{version} job "
            f"(the keys are exactly {_span(version)})",
        )
    missing = sorted(wanted - set(given))
    if missing:
        shown = ", ".join(str(key) for key in missing)
        raise refuse(
            "upgrade",
            f"lacks a function for version {shown}: a version-{version} job needs one "
            f"upgrade function per older version ({_span(version)}), each a cursor of "
            "that version in and a cursor of the next out",
        )
    for key in sorted(given):
        problem = _not_plain(given[key])
        if problem is not None:
            raise refuse_type(
                f"upgrade.{key}",
                f"{problem}: an upgrade function is a plain synchronous function "
                "(cursor in, cursor out) that does no I/O",
            )
    return tuple(given[key] for key in sorted(given))


def _mapping(upgrade: object) -> Mapping[Any, Any]:
    if not isinstance(upgrade, Mapping):
        raise refuse_type(
            "upgrade", f"must be a dict of version to function, got {type_name(upgrade)}"
        )
    return upgrade


def _span(version: int) -> str:
    return "none" if version == 1 else "1" if version == 2 else f"1 to {version - 1}"


def upgraded_cursor(cursor: Any, stored: int, upgrades: tuple[Upgrade, ...]) -> Any:
    """``cursor``, of version ``stored``, through each upgrade function from that
    version on, in order: a cursor of the newest version."""
    for version in range(stored, len(upgrades) + 1):
        cursor = upgrades[version - 1](cursor)
        if inspect.isawaitable(cursor) or inspect.isgenerator(cursor):
            close = getattr(cursor, "close", None)
            if close is not None:
                close()  # never started: closing runs none of its code
            raise mistake(
                "upgrade",
                f"the upgrade function of version {version} returned {type_name(cursor)}: "
                "an upgrade function is a plain synchronous function (cursor in, cursor out)",
            )
    return cursor


def runs_beyond_code(
    versions_by_job: Mapping[tuple[str, str], Mapping[int, int]],
    code_versions: Mapping[tuple[str, str], int],
) -> dict[tuple[str, str], tuple[int, int]]:
    """Per job of ``code_versions`` (its code's version), the running runs of a newer
    version, which that code never claims, and the lowest version that takes them:
    ``{(module_id, job): (runs, version)}``, jobs with none left out."""
    beyond: dict[tuple[str, str], tuple[int, int]] = {}
    for job, code_version in code_versions.items():
        newer = {
            version: runs
            for version, runs in versions_by_job.get(job, {}).items()
            if version > code_version
        }
        if newer:
            beyond[job] = (sum(newer.values()), min(newer))
    return beyond
