"""Counters over time: rates between two reads of a run, and progress against ``total``.

Shared by ``jobrun watch`` and the console's run page, so both show the same numbers.
A rate is per counter per second between two reads (the change in the counter over
the time between them). Progress needs a ``total`` counter above zero: the work done
is the counter ``done`` if there is one, else ``objects``, else the largest other
counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from jobrun._core.model.records import JobRun

TOTAL = "total"
PREFERRED_DONE = ("done", "objects")


def progress_of(counters: Mapping[str, int | float]) -> tuple[str, float, float] | None:
    """``(counter, done, total)`` for a progress bar, or ``None`` when there is no total."""
    total = counters.get(TOTAL)
    if total is None or total <= 0:
        return None
    for name in PREFERRED_DONE:
        if name in counters:
            return name, counters[name], total
    others = {name: value for name, value in counters.items() if name != TOTAL}
    if not others:
        return None
    name = max(others, key=lambda each: (others[each], each))
    return name, others[name], total


@dataclass(slots=True)
class Poll:
    """One read of the run, with the rates since the read before it."""

    run: JobRun
    at: float
    rates: dict[str, float] = field(default_factory=dict)

    def follow(self, run: JobRun, at: float) -> Poll:
        elapsed = at - self.at
        rates: dict[str, float] = {}
        if elapsed > 0:
            for name, value in run.counters.items():
                rates[name] = (value - self.run.counters.get(name, 0)) / elapsed
        return Poll(run, at, rates)

    def work_rates(self) -> dict[str, float]:
        """The rates of counters of work done: ``total`` is the size progress is
        measured against, so a "rate" of it means nothing (``jobrun watch`` and the
        console alike leave it out)."""
        return {name: rate for name, rate in self.rates.items() if name != TOTAL}


def span(seconds: float | timedelta | None) -> str:
    """A rough human duration: ``45s``, ``12m03s``, ``3h05m``, ``2d04h`` (CLI and console alike)."""
    if seconds is None:
        return ""
    whole = int(seconds.total_seconds() if isinstance(seconds, timedelta) else seconds)
    sign, whole = ("-", -whole) if whole < 0 else ("", whole)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d{hours:02d}h"
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"
