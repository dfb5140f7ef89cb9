"""The click group every command attaches to (commands live in ``jobrun/_cli/commands/``,
one module per command group).

The command modules import SQLAlchemy, rich and the store, which cost several
times what the rest of jobrun does; the group loads the module of a command only
when that command runs, so ``jobrun --help`` and a mistyped command stay cheap.
"""

from __future__ import annotations

import importlib
import sys

import click

_COMMANDS = "jobrun._cli.commands"
_ACTIONS = f"{_COMMANDS}.actions"
_RUNS = f"{_COMMANDS}.runs"

# Each command: the module that defines it, and the first paragraph of its help,
# which `jobrun --help` lists without importing the module (a test keeps them equal).
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "cancel": (
        _ACTIONS,
        "Fail a running run now. A pass in flight stops at its next step.",
    ),
    "db": (
        f"{_COMMANDS}.db",
        "Create, migrate and check jobrun's tables (Alembic revisions shipped with jobrun).",
    ),
    "health": (
        f"{_COMMANDS}.health",
        "Counts for a dashboard: running, due now, leased, failed, the oldest due wait, "
        "and the due runs of each job.",
    ),
    "pause": (
        f"{_COMMANDS}.pauses",
        "Pause a run, a job or a limit key: no driver takes it until unpaused.",
    ),
    "prune": (
        _ACTIONS,
        "Delete finished runs (and their ledgers) that ended before a cutoff.",
    ),
    "release": (
        _ACTIONS,
        "Clear a run's lease so any driver may take it at once.",
    ),
    "resume": (
        _ACTIONS,
        "Put a failed run back to running, from its last committed cursor.",
    ),
    "runs": (_RUNS, "List runs, newest first."),
    "schedules": (
        f"{_COMMANDS}.schedules",
        "List the app's schedules: cron, catch-up, next slot, and the last slot's run.",
    ),
    "show": (
        _RUNS,
        "Show one run in full: its record, its lease and its step ledger.",
    ),
    "start": (
        f"{_COMMANDS}.start",
        "Start a run of MODULE/JOB, or join the live run of the same key.",
    ),
    "unpause": (
        f"{_COMMANDS}.pauses",
        "Unpause a run, a job or a limit key: what it held is due at once.",
    ),
    "ui": (
        f"{_COMMANDS}.ui",
        "Serve the operator console: runs, one run live, health; act on runs.",
    ),
    "watch": (
        _RUNS,
        "Follow a run live until it ends; exit 0 when it is done, 1 when it failed "
        "(or was cancelled).",
    ),
    "worker": (
        f"{_COMMANDS}.worker",
        "Drive the due runs of the given databases until SIGTERM or SIGINT.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first look-up (see ``LAZY_COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            importlib.import_module(LAZY_COMMANDS[cmd_name][0])  # registers it on the group
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their short help, as click lists them, from ``LAZY_COMMANDS``."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self._short_help(ctx, name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _short_help(self, ctx: click.Context, name: str, limit: int) -> str:
        if name in LAZY_COMMANDS:
            # A stand-in with the same first paragraph shortens it as the real command would.
            return click.Command(name, help=LAZY_COMMANDS[name][1]).get_short_help_str(limit)
        command = self.get_command(ctx, name)
        return "" if command is None else command.get_short_help_str(limit)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    cli()
