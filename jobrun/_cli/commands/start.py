"""``jobrun start``: one run from the arguments, or many from a file of JSON lines.

``--from-file FILE`` reads one start per line, each a JSON object with the keys
of :class:`jobrun.JobStart` (``module_id`` and ``job`` required; ``instance``,
``payload``, ``priority``, ``start_at`` as ISO 8601 text with an offset); blank
lines are skipped. Every line is read and checked before anything is written: a
bad line stops the command with one line naming it, and nothing is started. The
starts go to :func:`jobrun.start_job_runs` in batches of ``BATCH``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import click

from jobrun._api import start_job_run, start_job_runs
from jobrun._cli.app import cli
from jobrun._cli.connect import run_on_store, url_option
from jobrun._cli.job_names import check_registered, warn_unchecked
from jobrun._cli.params import JsonValue, json_option
from jobrun._cli.render import dumps, instant, run_json
from jobrun._core import DEFAULT_INSTANCE, JobRun, JobStart, check_start, starts_later_at
from jobrun.errors import JobValidationError
from jobrun.sql.store import SqlJobRunStore

BATCH = 5_000
_FIELDS = {"module_id", "job", "instance", "payload", "priority", "start_at"}


class BadLine(click.UsageError):
    """A line of ``--from-file`` that is not a start (exit 2, one line, nothing written)."""

    def __init__(self, path: Path, number: int, problem: str) -> None:
        super().__init__(f"{path} line {number}: {problem}")


def _at_option(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 instant (e.g. 2030-01-02T03:04:05Z)", param_hint="--at"
        ) from None
    if moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} has no offset: add one (Z for UTC, or +02:00)", param_hint="--at"
        )
    return moment


def _start_at(text: Any, where: Callable[[str], BadLine]) -> datetime:
    if not isinstance(text, str):
        raise where(f"start_at must be ISO 8601 text, got {type(text).__name__}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise where(f"start_at {text!r} is not an ISO 8601 instant") from None
    if moment.tzinfo is None:
        raise where(f"start_at {text!r} has no offset: add one (Z for UTC, or +02:00)")
    return moment


def _line_start(text: str, where: Callable[[str], BadLine]) -> JobStart:
    """One line as a start; ``where(problem)`` is the refusal naming the line."""
    try:
        given = json.loads(text)
    except ValueError as error:
        raise where(f"not valid JSON: {error}") from None
    except RecursionError:
        raise where("nested too deeply to decode") from None
    if not isinstance(given, dict):
        raise where(f"must be a JSON object, got {type(given).__name__}")
    unknown = sorted(set(given) - _FIELDS)
    if unknown:
        raise where(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    missing = [name for name in ("module_id", "job") if name not in given]
    if missing:
        raise where(f"{missing[0]} is missing")
    if given.get("start_at") is not None:
        given["start_at"] = _start_at(given["start_at"], where)
    return JobStart(**given)


def read_starts(path: Path) -> tuple[list[JobStart], list[int]]:
    """The starts of a JSON-lines file and the line number of each."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise click.UsageError(f"cannot read {path}: {error}") from None
    starts: list[JobStart] = []
    numbers: list[int] = []
    for number, text in enumerate(lines, start=1):
        if text.strip():
            starts.append(_line_start(text, partial(BadLine, path, number)))
            numbers.append(number)
    return starts, numbers


async def _start_all(
    store: SqlJobRunStore, starts: list[JobStart], numbers: list[int], path: Path
) -> list[JobRun]:
    """Check every start (nothing written on a refusal), then start them in batches."""
    for index, start in enumerate(starts):
        try:
            check_start(start, store.limits.max_payload_bytes)
        except JobValidationError as error:
            raise BadLine(path, numbers[index], error.message) from None
    runs: list[JobRun] = []
    for first in range(0, len(starts), BATCH):
        runs += await start_job_runs(store, starts[first : first + BATCH])
    return runs


def _said(run: JobRun) -> str:
    line = f"{'joined' if run.joined else 'started'} {run.id}"
    later = starts_later_at(run)
    return line if later is None else f"{line} (starts at {instant(later)} UTC)"


@cli.command("start")
@url_option
@click.argument("module_id", metavar="MODULE", required=False)
@click.argument("job", metavar="JOB", required=False)
@click.option(
    "--instance", "-i", default=DEFAULT_INSTANCE, show_default=True,
    help="The instance part of the run's key.",
)  # fmt: skip
@click.option("--payload", type=JsonValue(), default=None, help="The run's payload, as JSON.")
@click.option(
    "--priority", type=int, default=0, show_default=True,
    help="Higher is claimed first among due runs.",
)  # fmt: skip
@click.option(
    "--at", "start_at", default=None, metavar="INSTANT",
    help="Start later, at this instant: ISO 8601 with an offset (2030-01-02T03:04:05Z).",
)  # fmt: skip
@click.option(
    "--in", "delay_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
    help="Start later, this many seconds from now.",
)  # fmt: skip
@click.option(
    "--from-file", "from_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
    help="Start one run per line of FILE (JSON lines: module_id, job, instance, payload, "
    "priority, start_at), all checked before any is started.",
)  # fmt: skip
@click.option(
    "--app", "app", metavar="MODULE:REGISTRY", default=None,
    help="Refuse a job this JobRegistry does not register (without it, the name is not checked).",
)  # fmt: skip
@json_option
def start(**given: Any) -> None:
    """Start a run of MODULE/JOB, or join the live run of the same key.

    Prints `started RUN_ID` when a new run was inserted, `joined RUN_ID` when a
    run of the key was already live (its payload is kept, this one is ignored),
    followed by `(starts at ...)` for a run not due yet (--at, --in). A driver
    that registers the job picks the run up. With --app, a job that registry
    does not register is refused (with the nearest names it does); without it, a
    warning says the name was not checked. With --from-file, MODULE and JOB are
    not given: each line of FILE is a start, and one line is printed per line.

    \b
    Example:
      jobrun start --url sqlite+aiosqlite:///app.db shop reindex -i shop-42 \\
          --payload '{"shop": "shop-42"}' --app myapp.jobs:registry
      jobrun start --url sqlite+aiosqlite:///app.db shop reindex --in 3600
      jobrun start --url sqlite+aiosqlite:///app.db --from-file starts.jsonl
    """
    if given["from_file"] is not None:
        _from_file(given)
        return
    module_id, job = given["module_id"], given["job"]
    if module_id is None or job is None:
        raise click.UsageError("give MODULE and JOB, or --from-file FILE")
    if given["app"] is not None:
        check_registered(given["app"], module_id, job)
    start_at = None if given["start_at"] is None else _at_option(given["start_at"])

    async def act(store: SqlJobRunStore) -> JobRun:
        return await start_job_run(
            store,
            module_id=module_id,
            job=job,
            instance=given["instance"],
            payload=given["payload"],
            priority=given["priority"],
            start_at=start_at,
            delay_s=given["delay_s"],
        )

    run = run_on_store(given["url"], act)
    if given["as_json"]:
        click.echo(dumps({"started": not run.joined, "run": run_json(run)}))
    else:
        click.echo(_said(run))
    if given["app"] is None:
        # After the answer, on stderr: a script reading the first line still gets it.
        warn_unchecked(module_id, job)


def _from_file(given: dict[str, Any]) -> None:
    single = ("module_id", "job", "payload", "start_at", "delay_s")
    if any(given[name] is not None for name in single) or given["priority"] != 0:
        raise click.UsageError("--from-file takes the starts from FILE: give no MODULE, JOB, "
                               "--payload, --priority, --at or --in with it")  # fmt: skip
    path: Path = given["from_file"]
    starts, numbers = read_starts(path)
    if given["app"] is not None:
        for start in starts:
            check_registered(given["app"], start.module_id, start.job)
    runs = run_on_store(given["url"], lambda store: _start_all(store, starts, numbers, path))
    if given["as_json"]:
        click.echo(dumps([{"started": not run.joined, "run": run_json(run)} for run in runs]))
    else:
        for run in runs:
            click.echo(_said(run))
