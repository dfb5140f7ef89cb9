"""Interleaved samples, their spread, and the clocks a sample reads.

Everything compared is sampled in one process, interleaved: each round takes one
sample of every variant, so a noisy neighbour spreads over all of them alike.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

Found = TypeVar("Found")
Sample = Callable[[], Awaitable[float]]
Order = Literal["flip", "rotate", "same"]


def round_order(names: list[str], round_number: int, order: Order) -> list[str]:
    """The variants' order in one round: flipped every other round, rotated by one
    each round, or always the same."""
    if order == "flip":
        return names if round_number % 2 == 0 else names[::-1]
    if order == "rotate":
        shift = round_number % len(names)
        return names[shift:] + names[:shift]
    return names


async def interleave_samples(
    variants: dict[str, Callable[[], Awaitable[Found]]],
    rounds: int,
    *,
    order: Order = "flip",
    warm_ups: int = 1,
    collect: bool = True,
) -> dict[str, list[Found]]:
    """``rounds`` samples per variant, one of each per round in ``order``, after
    ``warm_ups`` unrecorded samples of each (connections, prepared statements, caches)."""
    samples: dict[str, list[Found]] = {name: [] for name in variants}
    names = list(variants)
    for _ in range(warm_ups):
        for name in names:
            await variants[name]()
    for round_number in range(rounds):
        for name in round_order(names, round_number, order):
            if collect:
                # Each sample starts with an empty nursery: a full collection that the
                # previous variant's garbage made due (tens of ms) is not charged to this one.
                gc.collect()
            samples[name].append(await variants[name]())
    return samples


async def interleave(variants: dict[str, Sample], rounds: int) -> dict[str, float]:
    """Median of ``rounds`` samples per variant, one of each per round, order flipped."""
    samples = await interleave_samples(variants, rounds)
    return {name: round(statistics.median(values), 4) for name, values in samples.items()}


def spread(values: list[float]) -> dict[str, float]:
    """Median, interquartile range and extremes of some samples (or per-round ratios)."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        low, _, high = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        low = high = ordered[0]
    return {
        "median": round(statistics.median(ordered), 4),
        "q1": round(low, 4),
        "q3": round(high, 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
    }


def round_ratios(numerators: list[float], denominators: list[float]) -> dict[str, float]:
    """The spread of per-round ratios: each round's two samples were taken side by side."""
    return spread([top / bottom for top, bottom in zip(numerators, denominators, strict=True)])


def timed_ms(started: float, count: int = 1) -> float:
    """Milliseconds per item since ``started`` (``time.perf_counter``)."""
    return (time.perf_counter() - started) * 1000 / count


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's ended children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def rss_mb() -> float:
    """This process's largest resident set so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def profiled(label: str, run: Callable[[], Awaitable[Any]], top: int = 18) -> str:
    """Run once under cProfile; return (and print) the top functions by own time."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        await run()
    finally:
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    # print_stats(top) already keeps the top rows: the header once, then the rows.
    summary = "\n".join(lines)
    print(f"\n--- profile: {label} (own time) ---\n{summary}")
    return summary
