"""The ``jobrun worker`` command: drive due runs of one or more databases until signalled.

Wiring only: the loop itself is :func:`jobrun.run_worker`. This module loads the
``--app`` registry, sets up logging (the library never does), installs the
signal handlers and, with ``--metrics-port``, serves Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from jobrun._cli import heartbeat
from jobrun._cli.app import cli
from jobrun._cli.connect import (
    URL_ENVVAR,
    OneLineUsageError,
    first_line,
    missing_sqlite_message,
    outdated_message,
    parse_url,
    schema_option,
    sqlite_file,
)
from jobrun._cli.event_loop import loop_option, run_on
from jobrun._cli.job_names import load_registry
from jobrun._cli.many_databases import urls_in
from jobrun._cli.params import duration_option
from jobrun._core import (
    DEFAULT_HEARTBEAT_S,
    GONE_AFTER_BEATS,
    LOG_PASSES,
    DriveOptions,
    JobRegistry,
    PassObserver,
    observe_all,
)
from jobrun.errors import (
    CodeOutdatedError,
    JobValidationError,
    SchemaOutdatedError,
    StoreError,
)
from jobrun.worker import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_CONNECTIONS_PER_DATABASE,
    DEFAULT_MAX_OPEN_SQLITE,
    HealthCallback,
    run_worker,
)

log = logging.getLogger("jobrun.worker")

# What every LogRecord has; anything else on a record came through ``extra=``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(
            (key, value) for key, value in vars(record).items() if key not in _RECORD_FIELDS
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _configure_logging(level: str, style: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if style == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("jobrun").setLevel(level.upper())


def _metrics(port: int, host: str) -> tuple[PassObserver, HealthCallback]:
    try:
        from jobrun.prometheus import WorkerMetrics
    except ImportError as error:
        raise click.ClickException(
            "--metrics-port needs prometheus-client: pip install 'jobrun[prometheus]'"
        ) from error
    metrics = WorkerMetrics()
    try:
        metrics.serve(port, host)
    except OSError as error:
        raise click.ClickException(
            f"cannot serve metrics on {host}:{port}: {first_line(error)}"
        ) from error
    log.info("serving metrics on http://%s:%d/metrics", host, port)
    return metrics, metrics.record_health


@dataclass(frozen=True)
class _Lifetime:
    """How the process shows it is alive, and how long it may drain when told to stop."""

    heartbeat: Path | None
    drain_timeout_s: float | None


class _Stopping:
    """The signals' effect: the first stops claiming (and starts the drain's clock, if
    any); a second one, or the drain timeout, cancels the passes in flight."""

    def __init__(self, task: asyncio.Task[Any], drain_timeout_s: float | None) -> None:
        self.stop = asyncio.Event()
        self.forced = False
        self._task = task
        self._drain_timeout_s = drain_timeout_s

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stop.is_set():
            self._cancel("%s again: cancelling passes in flight; their leases go back", name)
            return
        log.info("%s: stopping; passes in flight finish (send it again to cancel them)", name)
        self.stop.set()
        if self._drain_timeout_s is not None:
            asyncio.get_running_loop().call_later(
                self._drain_timeout_s,
                self._cancel,
                "still draining after %g s: cancelling passes in flight; their leases go back",
                self._drain_timeout_s,
            )

    def _cancel(self, message: str, *arguments: object) -> None:
        if not self.forced:
            self.forced = True
            log.info(message, *arguments)
            self._task.cancel()


def _reread(source: _Urls, reloads: asyncio.Queue[Any]) -> None:
    """SIGHUP: read the URLs file again; the worker serves what it lists now."""
    try:
        urls = source.read()
        _check_sqlite_files(tuple(urls))
    except (OSError, click.ClickException) as error:
        log.error("SIGHUP: cannot read %s (%s); serving the same databases", source.file, error)
        return
    log.info("SIGHUP: %s lists %d databases", source.file, len(urls))
    reloads.put_nowait(urls)


async def _work(
    source: _Urls,
    registry: JobRegistry,
    options: DriveOptions,
    worker_options: dict[str, Any],
    lifetime: _Lifetime,
) -> bool:
    """Run the worker until a signal; ``True`` when it stopped gracefully."""
    urls = source.read()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopping = _Stopping(task, lifetime.drain_timeout_s)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.on_signal, signum)
    reloads: asyncio.Queue[Any] | None = None
    if source.file is not None:
        reloads = asyncio.Queue()
        loop.add_signal_handler(signal.SIGHUP, _reread, source, reloads)
    beating = None
    if lifetime.heartbeat is not None:
        beating = loop.create_task(heartbeat.beat(lifetime.heartbeat))
    try:
        await run_worker(
            urls, registry, options=options, stop=stopping.stop, reloads=reloads, **worker_options
        )
    except asyncio.CancelledError:
        if not stopping.forced:
            raise
        task.uncancel()
        return False
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        if beating is not None:
            beating.cancel()
    return True


@dataclass(frozen=True)
class _Urls:
    """Where the worker's databases come from: ``--url`` options, and a file read at
    start and again at each SIGHUP."""

    urls: tuple[str, ...]
    file: Path | None

    def read(self) -> list[str]:
        found = list(self.urls)
        if self.file is not None:
            with self.file.open(encoding="utf-8") as lines:
                found += urls_in(lines)
        if not found:
            raise click.UsageError("no database: pass --url (repeatable) or --urls-file")
        # Spelled as the worker makes its engines (sqlite:/// gets aiosqlite, ...).
        return [parse_url(url).render_as_string(hide_password=False) for url in found]


@cli.command("worker")
@click.option(
    "--url",
    "urls",
    multiple=True,
    envvar=URL_ENVVAR,
    show_envvar=True,
    metavar="URL",
    help="A database to drive; repeat for several (each gets its own drivers). "
    f"{URL_ENVVAR} may hold several, separated by spaces.",
)
@click.option(
    "--urls-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help="A file of database URLs, one a line (# comments allowed), as for `jobrun db "
    "upgrade`; read again on SIGHUP (added databases start, removed ones stop).",
)
@click.option(
    "--max-open-sqlite",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_OPEN_SQLITE,
    show_default=True,
    help="SQLite databases open at once (each an aiosqlite thread and 3 files); an idle "
    "one is closed, least recently used first, when another needs its place.",
)
@click.option(
    "--max-databases",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Serve at most N of the databases, each only while holding its serving lease "
    "(SQLite: a lock on <file>.jobrun-worker; Postgres: an advisory lock on the presence "
    "session), so several workers over one set split it; a dead worker's databases are "
    "taken by others with room within about 5 s. Default: serve all, shared with any "
    "other worker.",
)
@click.option(
    "--max-connections-per-database",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_CONNECTIONS_PER_DATABASE,
    show_default=True,
    help="Postgres: connections at once per database for passes, opened when needed "
    "and closed when idle; beside them, one session per database for presence and LISTEN.",
)
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:REGISTRY",
    help="The JobRegistry to run, by import path, e.g. myapp.jobs:registry.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds between polls of an idle database (idle polls back off up to this).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Runs one driver takes per round before looking again.",
)
@click.option(
    "--max-passes",
    type=int,
    default=1,
    show_default=True,
    help="Passes a run gets per claim before it goes back in line (below 1 counts as 1).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Passes in flight at once, across all databases.",
)
@click.option(
    "--pass-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a pass may take before it is failed (and retried).",
)
@duration_option(
    "--prune-after",
    help="Delete finished runs of the app's jobs that ended longer ago than this "
    "(30d, 12h, ...); a job's keep_for wins for its runs. Runs of jobs the app does "
    "not register are kept (see --prune-unregistered-after). Checked at start and "
    "every 10 minutes.",
)
@duration_option(
    "--prune-unregistered-after",
    help="Also delete finished runs of jobs this app does NOT register (other apps' "
    "jobs, removed jobs) that ended longer ago than this; a job's keep_for recorded "
    "by its own workers still wins when longer.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    default=None,
    help="Serve Prometheus metrics on this port (needs jobrun[prometheus]).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="The address the metrics server binds.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Level of the jobrun loggers (info: one line per pass; debug: per step).",
)
@schema_option
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line with the structured fields (run_id, outcome, ...).",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="After SIGTERM, wait at most this long for passes in flight, then cancel them "
    "(their leases go back) and exit with 1. Default: wait for them to finish.",
)
@click.option(
    "--heartbeat-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help=f"Touch this file every {heartbeat.HEARTBEAT_INTERVAL_S:g} s while the worker's event "
    "loop turns, whatever the databases do (for a liveness probe); removed at exit.",
)
@click.option(
    "--register-every",
    "heartbeat_s",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_HEARTBEAT_S,
    show_default=True,
    metavar="SECONDS",
    help="Write this worker's row in each database (its jobs, for the console and "
    f"`jobrun health`) every SECONDS; it counts as gone after {GONE_AFTER_BEATS} of them "
    "without one. Over many databases it is stretched to keep the writes to 2 a second.",
)
@loop_option
@click.option(
    "--watchdog/--no-watchdog",
    default=True,
    show_default=True,
    help="End the process (SIGKILL) when a step body that cannot be cancelled is still "
    "running when its run may be taken over (--no-watchdog: let it overlap).",
)
def worker(
    urls: tuple[str, ...],
    app: str,
    interval: float,
    limit: int,
    max_passes: int,
    concurrency: int,
    pass_timeout: float | None,
    prune_after: timedelta | None,
    prune_unregistered_after: timedelta | None,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    log_format: str,
    schema: str | None,
    watchdog: bool,
    drain_timeout: float | None,
    heartbeat_file: Path | None,
    loop: str,
    **many: Any,
) -> None:
    """Drive the due runs of the given databases until SIGTERM or SIGINT.

    The first signal stops gracefully: nothing new is claimed, passes in flight
    finish, exit status 0. A second signal, or --drain-timeout running out,
    cancels the passes in flight (each hands its lease back at once) and exits
    with status 1. --heartbeat-file is for liveness probes. Idle databases are not
    polled (NOTIFY, inotify, due times wake them); SIGHUP reads --urls-file again.

    \b
    Example:
      jobrun worker --app myapp.jobs:registry --url postgresql+asyncpg://app@db/app \\
          --concurrency 4 --metrics-port 9464
    """
    registry = load_registry(app)
    source = _checked_urls(urls, many.pop("urls_file"))  # the rest: the --max-... options
    _configure_logging(log_level, log_format)
    observer, on_health = _watchers(metrics_port, metrics_host)
    with _one_line_errors():
        # Judged once, here: every drive of every database gets this object.
        options = DriveOptions(
            limit=limit,
            max_passes=max_passes,
            pass_timeout_s=pass_timeout,
            observer=observer,
            watchdog=watchdog,
        )
        worker_options = {
            "interval_s": interval,
            "concurrency": concurrency,
            "on_health": on_health,
            "prune_after": prune_after,
            "prune_unregistered_after": prune_unregistered_after,
            "schema": schema,
            **many,
        }
        lifetime = _Lifetime(heartbeat_file, drain_timeout)
        graceful = _run(source, registry, options, worker_options, lifetime, loop)
    if not graceful:
        sys.exit(1)


def _run(
    source: _Urls,
    registry: JobRegistry,
    options: DriveOptions,
    worker_options: dict[str, Any],
    lifetime: _Lifetime,
    loop: str = "auto",
) -> bool:
    if lifetime.heartbeat is not None:
        heartbeat.first_beat(lifetime.heartbeat)
    try:
        # On uvloop when installed, unless --loop says otherwise (jobrun._cli.event_loop).
        graceful: bool = run_on(loop, _work(source, registry, options, worker_options, lifetime))
        return graceful
    finally:
        if lifetime.heartbeat is not None:
            heartbeat.remove(lifetime.heartbeat)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """What stops the worker before it drives, said in one line."""
    try:
        yield
    except SchemaOutdatedError as error:
        raise click.ClickException(outdated_message(error)) from error
    except JobValidationError as error:  # e.g. a --schema this database cannot take
        raise OneLineUsageError(error.message) from error
    except (StoreError, CodeOutdatedError) as error:
        raise click.ClickException(error.message) from error
    except OSError as error:
        raise click.ClickException(f"database error: {first_line(error)}") from error


def _checked_urls(urls: tuple[str, ...], urls_file: Path | None) -> _Urls:
    source = _Urls(urls, urls_file)
    _check_sqlite_files(tuple(source.read()))
    return source


def _check_sqlite_files(urls: tuple[str, ...]) -> None:
    for url in urls:
        path = sqlite_file(parse_url(url))
        if path is not None and not path.exists():
            raise click.ClickException(missing_sqlite_message(path, url))


def _watchers(
    metrics_port: int | None, metrics_host: str
) -> tuple[PassObserver, HealthCallback | None]:
    """Who hears each pass and each health reading: the log, and the metrics if served."""
    if metrics_port is None:
        return LOG_PASSES, None
    metrics, on_health = _metrics(metrics_port, metrics_host)
    return observe_all(LOG_PASSES, metrics), on_health
