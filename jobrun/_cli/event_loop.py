"""Which event loop ``jobrun worker`` runs on: asyncio's own, or uvloop when installed.

uvloop (the ``speed`` extra) runs the same asyncio code on libuv: the loop's own
work per statement (the ready queue, the selector, the socket writes) costs
less, which shows when many passes are in flight in one process. jobrun's code
is the same on both; ``--loop asyncio`` keeps the standard loop where uvloop is
installed.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import click

LOOP_ENVVAR = "JOBRUN_LOOP"
LOOPS = ("auto", "asyncio", "uvloop")

loop_option = click.option(
    "--loop",
    "loop",
    type=click.Choice(LOOPS),
    default="auto",
    show_default=True,
    envvar=LOOP_ENVVAR,
    show_envvar=True,
    help="The event loop: uvloop (pip install 'jobrun[speed]'), asyncio's own, or auto: "
    "uvloop when installed.",
)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``asyncio.Runner`` (``None``: asyncio's default loop)."""
    if choice == "asyncio" or (choice == "auto" and importlib.util.find_spec("uvloop") is None):
        return None
    try:
        # By name: an optional dependency, typed or not wherever it is installed.
        uvloop = importlib.import_module("uvloop")
    except ImportError as error:
        raise click.UsageError(
            f"--loop uvloop: uvloop cannot be imported ({error}); install it with "
            "pip install 'jobrun[speed]', or use --loop asyncio"
        ) from error
    made: Callable[[], Any] = uvloop.new_event_loop
    return made


def run_on(choice: str, main: Any) -> Any:
    """Run the coroutine ``main`` to its end on the chosen loop (like ``asyncio.run``).
    The worker's "worker started" line names the loop, so an operator sees which one
    ``auto`` took (logged there, not here: a refusal before the start is one line)."""
    factory = loop_factory(choice)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
