"""``jobrun db`` on many databases: which ones, how many at a time, one line each.

``--url`` may be given several times and ``--urls-file`` names a file of URLs
(one a line, ``#`` comments and blank lines ignored, ``-`` for stdin). One
database keeps the plain one-database output; several get a line each, prefixed
with the URL (password hidden), then a summary line. A failing database is
reported and the others go on; the exit status is 1 if any failed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import IO, TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from jobrun.sql.upgrades.provisioning import DEFAULT_CONCURRENCY, DatabaseOutcome, on_each_database

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


def many_urls_options(command: F) -> F:
    """``--url`` (repeatable, or JOBRUN_DATABASE_URL), ``--urls-file`` and ``--concurrency``."""
    command = click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=DEFAULT_CONCURRENCY,
        show_default=True,
        help="With several databases: how many are worked on at a time.",
    )(command)
    command = click.option(
        "--urls-file",
        type=click.File("r"),
        default=None,
        metavar="FILE",
        help="A file of database URLs, one a line (# comments allowed; - for stdin).",
    )(command)
    return click.option(
        "--url",
        "urls",
        envvar="JOBRUN_DATABASE_URL",
        show_envvar=True,
        multiple=True,
        metavar="URL",
        help="Database URL, e.g. sqlite:///app.db or postgresql://user@host/db; "
        "repeat for several databases.",
    )(command)


def urls_in(lines: Iterable[str]) -> list[str]:
    """The URLs of a URLs file: one a line, blank lines and ``#`` comments skipped."""
    return [text for text in (line.strip() for line in lines) if text and not text.startswith("#")]


def chosen_urls(urls: tuple[str, ...], urls_file: IO[str] | None) -> list[str]:
    chosen = list(urls)
    if urls_file is not None:
        chosen += urls_in(urls_file)
    if not chosen:
        raise click.UsageError("no database: pass --url (repeatable) or --urls-file")
    return chosen


def run_on_each(
    urls: list[str], act: Callable[[AsyncEngine], Awaitable[T]], concurrency: int
) -> list[DatabaseOutcome[T]]:
    return asyncio.run(on_each_database(urls, act, concurrency=concurrency))


def report(
    outcomes: list[DatabaseOutcome[T]], describe: Callable[[T], tuple[str, str]]
) -> Counter[str]:
    """Print one line per database and a summary; ``describe`` gives (tally word, line).
    Returns how many databases got each word ("failed" for those that failed)."""
    tally: Counter[str] = Counter()
    for outcome in outcomes:
        if outcome.error is not None or outcome.value is None:
            tally["failed"] += 1
            click.echo(f"{outcome.url}: FAILED: {outcome.error}")
        else:
            word, line = describe(outcome.value)
            tally[word] += 1
            click.echo(f"{outcome.url}: {line}")
    parts = ", ".join(f"{count} {word}" for word, count in sorted(tally.items()))
    click.echo(f"{len(outcomes)} databases: {parts}")
    return tally
