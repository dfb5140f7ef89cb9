"""The click group every command attaches to (commands live in sibling modules)."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobrun")
def cli() -> None:
    """Operate jobrun's durable job runs: migrate, inspect, act, and drive them."""


def main() -> None:
    # Imported here so that each command module registers itself on the group.
    from jobrun._cli import commands, console, schedules, worker  # noqa: F401  (registration side effect)

    cli()
