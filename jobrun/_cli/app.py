"""The click group every command attaches to (commands live in sibling modules)."""

from __future__ import annotations

import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobrun")
def cli() -> None:
    """Operate jobrun's durable job runs: migrate, inspect, act, and drive them."""


def _refuse_undecodable(arguments: list[str]) -> None:
    """Exit 2 on an argument Python could only decode with lone surrogates (not UTF-8)."""
    for argument in arguments:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            shown = argument.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            click.echo(f"Error: argument '{shown}' is not valid UTF-8 text", err=True)
            raise SystemExit(2) from None


def main() -> None:
    _refuse_undecodable(sys.argv[1:])
    # Imported here so that each command module registers itself on the group.
    from jobrun._cli import commands, console, schedules, worker  # noqa: F401  (registration side effect)

    cli()
