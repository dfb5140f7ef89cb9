"""The activity chart's geometry: bars in SVG coordinates, computed here and drawn by
``activity.html`` (server-rendered SVG: no script, no library, and the stylesheet's
colours, so dark mode applies).

Per bucket two bars side by side: runs started, and runs finished with the
failed ones as the bar's lower, red part. The vertical scale is rounded up to
a readable number so the grid lines fall on round values.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobrun._core import Bucket, Resolution

WIDTH = 720
HEIGHT = 180
LEFT = 44  # room for the scale's numbers
BOTTOM = 22  # room for the time labels
TOP = 8


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str  # started, finished, failed
    title: str


@dataclass(frozen=True, slots=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    grid: list[Label]  # y positions with their value
    times: list[Label]
    totals: tuple[int, int, int]
    baseline: float
    left: int


def _ceiling(value: int) -> int:
    """The least of 1, 2, 5 times a power of ten at or above ``value`` (at least 1)."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10


def _label(bucket: Bucket, resolution: Resolution) -> str:
    return bucket.starts_at.strftime("%H:%M")


def chart_of(buckets: list[Bucket], resolution: Resolution) -> Chart:
    """Bars and labels for ``buckets`` (oldest first)."""
    top = _ceiling(max((max(b.counts.started, b.counts.finished) for b in buckets), default=1))
    plot_height = HEIGHT - TOP - BOTTOM
    baseline = HEIGHT - BOTTOM
    slot = (WIDTH - LEFT) / max(1, len(buckets))
    bar_width = max(1.0, slot * 0.4)
    bars: list[Bar] = []
    times: list[Label] = []
    every = max(1, len(buckets) // 6)
    for index, bucket in enumerate(buckets):
        x = LEFT + index * slot
        counts = bucket.counts
        when = _label(bucket, resolution)
        for offset, kind, value in (
            (0.1, "started", counts.started),
            (0.5, "finished", counts.finished),
            (0.5, "failed", counts.failed),
        ):
            if not value:
                continue
            height = plot_height * value / top
            title = f"{when} UTC: {value} {kind} in this {resolution.name}"
            bars.append(
                Bar(
                    round(x + slot * offset, 1),
                    round(baseline - height, 1),
                    round(bar_width, 1),
                    round(height, 1),
                    kind,
                    title,
                )
            )
        if index % every == 0:
            times.append(Label(round(x, 1), HEIGHT - 6, when))
    grid = [
        Label(LEFT - 4, round(baseline - plot_height * part / 2, 1), f"{top * part // 2:,}")
        for part in (0, 1, 2)
    ]
    totals = (
        sum(b.counts.started for b in buckets),
        sum(b.counts.finished for b in buckets),
        sum(b.counts.failed for b in buckets),
    )
    return Chart(WIDTH, HEIGHT, bars, grid, times, totals, baseline, LEFT)
