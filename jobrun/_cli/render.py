"""How records look on a terminal (rich) and to scripts (JSON).

rich is imported inside the functions that draw, so that a command printing JSON
or one plain line (``start``, ``cancel``, ``--json``) does not pay its import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from jobrun._core import (
    JobRun,
    JobRunHealth,
    RateLimitBucket,
    StepRow,
    runs_beyond_code,
    span,
    starts_later_at,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

STATUS_STYLES = {"running": "cyan", "done": "green", "failed": "red", "cancelled": "magenta"}
PIPE_WIDTH = 200


def terminal(stderr: bool = False) -> Console:
    """Where this command's text goes: a rich ``Console`` on stdout (or stderr).

    Written to a pipe or file, rich would wrap at 80 columns; a wide table reads
    better unwrapped there, so it gets 200 columns unless ``COLUMNS`` says otherwise.
    Markup is off: what is printed is stored data (a lease's ``[jobrun host=...]``, an
    error quoting ``[red]``), never rich's style tags; styles come as ``Text``.
    """
    from rich.console import Console

    made = Console(stderr=stderr, highlight=False, markup=False)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made = Console(stderr=stderr, highlight=False, markup=False, width=PIPE_WIDTH)
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


def number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def counters_text(counters: Mapping[str, int | float]) -> str:
    return " ".join(f"{name}={number(value)}" for name, value in sorted(counters.items()))


def key_of(run: JobRun) -> str:
    return f"{run.module_id}/{run.job}/{run.instance}"


def status_text(status: str) -> Text:
    from rich.text import Text

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


def health_json(
    health: JobRunHealth, registered: Mapping[tuple[str, str], int] | None = None
) -> dict[str, Any]:
    """``registered``: the jobs of ``--app`` and their code's versions."""
    data = asdict(health)
    data["due_by_job"] = [
        {"module_id": module_id, "job": job, "due": due}
        | ({} if registered is None else {"registered": (module_id, job) in registered})
        for (module_id, job), due in health.due_by_job.items()
    ]
    beyond = {} if registered is None else runs_beyond_code(health.versions_by_job, registered)
    data["versions_by_job"] = [
        {
            "module_id": module_id,
            "job": job,
            "runs_by_version": {str(v): n for v, n in runs.items()},
        }
        | ({} if registered is None else _beyond_json(beyond.get((module_id, job))))
        for (module_id, job), runs in health.versions_by_job.items()
    ]
    return data


def _beyond_json(beyond: tuple[int, int] | None) -> dict[str, Any]:
    """How many runs the registry's code never claims, and the version that would."""
    runs, version = beyond if beyond is not None else (0, None)
    return {"runs_beyond_code": runs, "needs_version": version}


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


# -- tables -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    min_width: int
    cell: Callable[[JobRun, datetime], str | Text]
    justify: Literal["left", "right"] = "left"
    wraps: bool = False


# In the order they are given room: what tells runs apart and what is wrong first.
_RUN_COLUMNS = (
    _Column("id", 26, lambda run, _at: run.id),
    _Column("key", 20, lambda run, _at: key_of(run), wraps=True),
    _Column("status", 9, lambda run, _at: status_text(run.outcome)),
    _Column("last error", 14, lambda run, _at: run.last_error or "", wraps=True),
    _Column("age", 6, lambda run, at: span(at - run.started_at), justify="right"),
    _Column("attempts", 8, lambda run, _at: str(run.attempts), justify="right"),
    _Column("counters", 14, lambda run, _at: counters_text(run.counters), wraps=True),
    _Column("priority", 8, lambda run, _at: str(run.priority), justify="right"),
    _Column(
        "cursor",
        12,
        lambda run, _at: "" if run.cursor is None else compact_json(run.cursor),
        wraps=True,
    ),
    _Column("updated", 19, lambda run, _at: instant(run.updated_at)),
    _Column("next attempt", 19, lambda run, _at: instant(run.next_attempt_at)),
    _Column("started", 19, lambda run, _at: instant(run.started_at)),
)
# Between two columns: padding on each side and the (blank) divider.
_GAP = 3


def _fitting_columns(width: int) -> list[_Column]:
    """The leading columns whose narrowest widths fit ``width`` (id, key, status always)."""
    chosen: list[_Column] = []
    used = -_GAP
    for column in _RUN_COLUMNS:
        used += column.min_width + _GAP
        if used > width and len(chosen) >= 3:
            break
        chosen.append(column)
    return chosen


def _flexible_widths(columns: list[_Column], rows: list[list[str | Text]], width: int) -> list[int]:
    """Each column's width: fixed ones their own, the rest share what is left, in order."""
    widths = [column.min_width for column in columns]
    spare = width - sum(widths) - _GAP * (len(columns) - 1)
    for index, column in enumerate(columns):
        if not column.wraps or spare <= 0:
            continue
        longest = max([len(column.header), *(len(str(row[index])) for row in rows)])
        grown = min(max(0, longest - widths[index]), spare)
        widths[index] += grown
        spare -= grown
    return widths


def runs_table(runs: Iterable[JobRun], at: datetime, width: int = PIPE_WIDTH) -> Table:
    """``jobrun runs``: as many columns as ``width`` holds, one line per run.

    A long cell (key, last error, counters, cursor) is cut with an ellipsis
    rather than folded letter by letter; ``jobrun show`` has the whole record.
    """
    columns = _fitting_columns(width)
    rows = [
        [
            shorten(cell, 300) if isinstance(cell, str) else cell
            for cell in (column.cell(run, at) for column in columns)
        ]
        for run in runs
    ]
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column, column_width in zip(columns, _flexible_widths(columns, rows, width), strict=True):
        table.add_column(
            column.header,
            width=column_width,
            justify=column.justify,
            no_wrap=True,
            overflow="ellipsis",
        )
    for row in rows:
        table.add_row(*row)
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
    if run.lease_epoch:
        text += f"; fencing epoch {run.lease_epoch}"
    return text


def waiting_text(run: JobRun) -> str | None:
    """The text "waiting until <instant> (Retry-After: <reason>)" while a run waits out the
    delay its last pass asked for (``RetryAfter``), or "starts at <instant>" while a run
    started later is not due yet; else ``None``."""
    later = starts_later_at(run)
    if later is not None:
        return f"starts at {instant(later)}"
    if run.status != "running" or run.lease_driver is not None:
        return None
    if not run.deferrals or run.next_attempt_at is None:
        return None
    why = f"Retry-After: {run.deferred_reason}" if run.deferred_reason else "Retry-After"
    text = f"waiting until {instant(run.next_attempt_at)} ({why})"
    if run.deferrals > 1:
        text += f"; deferred {run.deferrals} times in a row"
    return text


def _fields_table() -> Table:
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    return table


def run_view(run: JobRun, steps: Mapping[str, StepRow], at: datetime) -> RenderableType:
    """``jobrun show``: the whole record, the lease, then the step ledger."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    record = _fields_table()
    record.add_row("id", run.id)
    record.add_row("key", key_of(run))
    record.add_row("status", status_text(run.outcome))
    record.add_row("payload", compact_json(run.payload))
    record.add_row("cursor", compact_json(run.cursor))
    record.add_row("counters", counters_text(run.counters) or "-")
    record.add_row("attempts", str(run.attempts))
    record.add_row("priority", str(run.priority))
    version = "" if run.job_version == 1 else f", the last by job version {run.job_version}"
    record.add_row("passes", f"{run.passes_committed} committed{version}")
    record.add_row("last error", run.last_error or "-")
    if run.error_origin:
        record.add_row("raised at", run.error_origin)
    record.add_row("started", f"{instant(run.started_at)} ({span(at - run.started_at)} ago)")
    record.add_row("updated", f"{instant(run.updated_at)} ({span(at - run.updated_at)} ago)")
    if run.lease_driver is None:
        record.add_row("next attempt", waiting_text(run) or instant(run.next_attempt_at) or "-")
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


def health_table(
    health: JobRunHealth,
    registered: Mapping[tuple[str, str], int] | None = None,
    served: Mapping[tuple[str, str], int] | None = None,
) -> Table:
    """``served``: how many live workers register each job (due runs of a job none
    registers are marked)."""
    table = _fields_table()
    table.add_row("running", str(health.running))
    table.add_row("due now", str(health.due))
    table.add_row("leased", str(health.leased))
    table.add_row("  orphaned", str(health.orphaned))
    table.add_row("failed", str(health.failed))
    table.add_row("  cancelled", str(health.cancelled))
    table.add_row("oldest due waited", span(health.oldest_due_age_s))
    for (module_id, job), due in health.due_by_job.items():
        note = ""
        if registered is not None and (module_id, job) not in registered:
            note = "  (not registered by --app: nothing will run these)"
        elif served is not None and (module_id, job) not in served:
            note = "  (no live worker runs this job)"
        table.add_row(f"  due {module_id}/{job}", f"{due}{note}")
    for (module_id, job), runs in health.versions_by_job.items():
        if set(runs) != {1}:
            shown = ", ".join(f"v{version}: {count}" for version, count in runs.items())
            table.add_row(f"  versions {module_id}/{job}", shown)
    if registered is not None:
        beyond = runs_beyond_code(health.versions_by_job, registered)
        for (module_id, job), (count, version) in beyond.items():
            table.add_row(
                f"  beyond code {module_id}/{job}",
                f"{count} run{'' if count == 1 else 's'} need version ≥ {version} "
                f"(--app has version {registered[(module_id, job)]}: no running code "
                "of it can take them)",
            )
    for bucket in health.rate_limits:
        table.add_row(f"rate limit {bucket.key}", _bucket_text(bucket))
    for key, held in health.concurrency_slots.items():
        table.add_row(f"concurrency {key}", f"{held} in flight")
    return table


def _bucket_text(bucket: RateLimitBucket) -> str:
    """``50/s, burst 5: 2.4 tokens``, and who waits for how long when it is empty."""
    text = f"{bucket.per_second:g}/s, burst {bucket.burst}: {bucket.tokens:.1f} tokens"
    if bucket.waiting:
        text += f", {bucket.waiting} waiting"
    if bucket.empty_for_s > 0:
        text += f", empty for {bucket.empty_for_s:.2f}s"
    if bucket.cooling_until is not None:
        text += f", cooling down until {bucket.cooling_until} ({bucket.cooling_reason})"
    return text
