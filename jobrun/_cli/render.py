"""How records look on a terminal (rich) and to scripts (JSON)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from jobrun._core.records import JobRun, JobRunHealth, StepRow

STATUS_STYLES = {"running": "cyan", "done": "green", "failed": "red"}
PIPE_WIDTH = 200


def console(stderr: bool = False) -> Console:
    """A console for this command's output.

    Written to a pipe or file, rich would wrap at 80 columns; a wide table reads
    better unwrapped there, so it gets 200 columns unless ``COLUMNS`` says otherwise.
    """
    made = Console(stderr=stderr, highlight=False)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made = Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)
    return made


# -- plain values -----------------------------------------------------------------


def shorten(text: str | None, limit: int) -> str:
    if text is None:
        return ""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def instant(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def span(delta: timedelta | float) -> str:
    """A rough human duration: ``45s``, ``12m03s``, ``3h05m``, ``2d04h``."""
    seconds = int(delta.total_seconds() if isinstance(delta, timedelta) else delta)
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d{hours:02d}h"
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def counters_text(counters: Mapping[str, int | float]) -> str:
    return " ".join(f"{name}={number(value)}" for name, value in sorted(counters.items()))


def key_of(run: JobRun) -> str:
    return f"{run.module_id}/{run.job}/{run.instance}"


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, "yellow"))


def now() -> datetime:
    return datetime.now(UTC)


# -- JSON ---------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


def run_json(run: JobRun) -> dict[str, Any]:
    """Every field of the record; datetimes as ISO 8601 text in UTC."""
    return {item.name: _jsonable(getattr(run, item.name)) for item in fields(run)}


def decode_result(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def step_json(row: StepRow) -> dict[str, Any]:
    data = asdict(row)
    data["result"] = decode_result(row.result)
    data["completed"] = row.result is not None
    return data


def health_json(health: JobRunHealth) -> dict[str, Any]:
    return asdict(health)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


# -- tables -------------------------------------------------------------------------


def runs_table(runs: Iterable[JobRun], at: datetime) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("key", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("cursor", max_width=24)
    table.add_column("counters", overflow="fold")
    table.add_column("attempts", justify="right")
    table.add_column("priority", justify="right")
    table.add_column("last error", max_width=40)
    table.add_column("started", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    table.add_column("next attempt", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True)
    for run in runs:
        table.add_row(
            run.id,
            key_of(run),
            status_text(run.status),
            shorten(None if run.cursor is None else compact_json(run.cursor), 24),
            counters_text(run.counters),
            str(run.attempts),
            str(run.priority),
            shorten(run.last_error, 40),
            instant(run.started_at),
            instant(run.updated_at),
            instant(run.next_attempt_at),
            span(at - run.started_at),
        )
    return table


def lease_lines(run: JobRun, at: datetime) -> str:
    if run.lease_driver is None:
        text = "not leased"
    else:
        text = f"held by {run.lease_driver}"
        if run.lease_expires_at is not None:
            text += (
                f", expires {instant(run.lease_expires_at)} (in {span(run.lease_expires_at - at)})"
            )
    if run.lease_takeovers:
        text += f"; taken over {run.lease_takeovers} time(s)"
    return text


def _fields_table() -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    return table


def run_view(run: JobRun, steps: Mapping[str, StepRow], at: datetime) -> RenderableType:
    """``jobrun show``: the whole record, the lease, then the step ledger."""
    record = _fields_table()
    record.add_row("id", run.id)
    record.add_row("key", key_of(run))
    record.add_row("status", status_text(run.status))
    record.add_row("payload", compact_json(run.payload))
    record.add_row("cursor", compact_json(run.cursor))
    record.add_row("counters", counters_text(run.counters) or "-")
    record.add_row("attempts", str(run.attempts))
    record.add_row("priority", str(run.priority))
    record.add_row("last error", run.last_error or "-")
    record.add_row("started", f"{instant(run.started_at)} ({span(at - run.started_at)} ago)")
    record.add_row("updated", f"{instant(run.updated_at)} ({span(at - run.updated_at)} ago)")
    if run.lease_driver is None:
        record.add_row("next attempt", instant(run.next_attempt_at) or "-")
    record.add_row("ended", instant(run.ended_at) or "-")
    record.add_row("lease", lease_lines(run, at))
    if run.decode_error:
        record.add_row("decode error", Text(run.decode_error, style="red"))
    ledger = Table(
        title="step ledger (the current pass)", box=box.SIMPLE_HEAD, title_justify="left"
    )
    ledger.add_column("step", overflow="fold")
    ledger.add_column("state", no_wrap=True)
    ledger.add_column("attempts", justify="right")
    ledger.add_column("result", max_width=50)
    ledger.add_column("last error", max_width=50)
    for row in steps.values():
        done = row.result is not None
        ledger.add_row(
            row.step,
            Text("done", style="green") if done else Text("not done", style="yellow"),
            str(row.attempts),
            shorten(row.result, 50),
            shorten(row.last_error, 50),
        )
    parts: list[RenderableType] = [record, Text("")]
    parts.append(ledger if steps else Text("step ledger: empty (no pass in flight)"))
    return Group(*parts)


def health_table(health: JobRunHealth) -> Table:
    table = _fields_table()
    table.add_row("running", str(health.running))
    table.add_row("due now", str(health.due))
    table.add_row("leased", str(health.leased))
    table.add_row("failed", str(health.failed))
    table.add_row("oldest due waited", span(health.oldest_due_age_s))
    return table
