"""``jobrun watch``: poll one run and show it live until it ends.

Rates and progress come from :mod:`jobrun._core.model.progress` (the console's run page
shows the same numbers): rates per counter per second between two polls, and a
progress bar when the counters include ``total``.

On a terminal the view redraws in place (rich ``Live``). Written to a pipe or a
file, one line is printed per poll in which something changed, then the final
view once the run has ended, so logs and tests see the same facts.
"""

from __future__ import annotations

import asyncio
import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from jobrun._cli.render import (
    compact_json,
    counters_text,
    key_of,
    lease_lines,
    now,
    number,
    shorten,
    status_text,
)
from jobrun._core import JobRun, OperatorStore, Poll, get_job_run, progress_of, span
from jobrun.errors import JobRunNotFoundError


def _signature(run: JobRun) -> tuple[object, ...]:
    return (
        run.outcome,
        tuple(sorted(run.counters.items())),
        compact_json(run.cursor),
        run.attempts,
        run.last_error,
        run.lease_driver,
    )


def _progress_row(poll: Poll) -> RenderableType | None:
    found = progress_of(poll.run.counters)
    if found is None:
        return None
    name, done, total = found
    fraction = min(1.0, max(0.0, done / total))
    label = f" {number(done)} / {number(total)} {name} ({fraction:.1%})"
    rate = poll.rates.get(name, 0.0)
    if rate > 0 and done < total and poll.run.status == "running":
        label += f", about {span((total - done) / rate)} left"
    bar = ProgressBar(total=100.0, completed=fraction * 100.0, width=40)
    row = Table.grid()
    row.add_row(bar, Text(label))
    return row


def view(poll: Poll) -> RenderableType:
    run = poll.run
    header = Text.assemble(
        (run.id, "bold"),
        "  ",
        key_of(run),
        "  ",
        status_text(run.outcome),
        f"  {span(now() - run.started_at)} old",
    )
    parts: list[RenderableType] = [header]
    progress = _progress_row(poll)
    if progress is not None:
        parts.append(progress)
    counters = Table(box=None, pad_edge=False)
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    counters.add_column("per second", justify="right")
    rates = poll.work_rates()
    for name, value in sorted(run.counters.items()):
        rate = rates.get(name)
        counters.add_row(name, number(value), "-" if rate is None else f"{rate:,.1f}")
    parts.append(counters if run.counters else Text("no counters yet"))
    details = Table.grid(padding=(0, 2))
    details.add_row("cursor", shorten(compact_json(run.cursor), 100))
    details.add_row("attempts", str(run.attempts))
    details.add_row("last error", run.last_error or "-")
    details.add_row("lease", lease_lines(run, now()))
    parts.append(details)
    return Group(*parts)


def line(poll: Poll) -> str:
    """The one-line form printed per change when the output is not a terminal."""
    run = poll.run
    work = sorted(poll.work_rates().items())
    rates = " ".join(f"{name}/s={rate:,.1f}" for name, rate in work)
    text = f"{time.strftime('%H:%M:%S')} {run.outcome} {counters_text(run.counters) or '-'}"
    if rates:
        text += f" ({rates})"
    text += f" attempts={run.attempts}"
    if run.last_error:
        text += f" error={shorten(run.last_error, 60)!r}"
    return text


async def _read(store: OperatorStore, run_id: str) -> JobRun:
    run = await get_job_run(store, run_id)
    if run is None:
        raise JobRunNotFoundError(run_id)
    return run


async def watch(store: OperatorStore, run_id: str, interval_s: float, terminal: Console) -> JobRun:
    """Poll until the run is no longer running; return its final record."""
    poll = Poll(await _read(store, run_id), time.monotonic())
    plain = not terminal.is_terminal
    seen = _signature(poll.run)
    if plain:
        terminal.print(line(poll), soft_wrap=True)
    with Live(view(poll), console=terminal, auto_refresh=False, transient=False) as live:
        while poll.run.status == "running":
            await asyncio.sleep(interval_s)
            poll = poll.follow(await _read(store, run_id), time.monotonic())
            live.update(view(poll), refresh=True)
            if plain and _signature(poll.run) != seen:
                seen = _signature(poll.run)
                terminal.print(line(poll), soft_wrap=True)
    if plain:
        terminal.line()  # off a terminal, Live leaves its final view without a newline
    return poll.run
