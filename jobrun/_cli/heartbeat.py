"""``jobrun worker --heartbeat-file PATH``: a file whose age says the worker's event loop turns.

A liveness probe (Kubernetes, a container HEALTHCHECK, a supervisor) looks at the
file's modification time. The worker touches it every ``HEARTBEAT_INTERVAL_S``
from a task on its own event loop, whether or not any database answers, so a
database outage does not fail the probe (restarting the worker would not bring the
database back); a loop that no longer turns (a step body blocking it, a deadlock)
does. The first touch happens before any database is opened, and the file is
removed when the worker exits, so a file left from an earlier process is never
taken for this one's.

The probe needs no Python: ``test $(( $(date +%s) - $(stat -c %Y PATH) )) -lt 30``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import click

from jobrun._cli.connect import first_line

log = logging.getLogger("jobrun.worker")

HEARTBEAT_INTERVAL_S = 5.0
"""How often the file is touched; a probe should allow several intervals (30 s)."""


def touch(path: Path) -> None:
    """Create the file if needed and set its modification time to now."""
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path)


def first_beat(path: Path) -> None:
    """The first touch, before the worker starts: a path it cannot write stops it here."""
    try:
        touch(path)
    except OSError as error:
        raise click.ClickException(
            f"cannot write the heartbeat file {path}: {first_line(error)}"
        ) from error


async def beat(path: Path) -> None:
    """Touch ``path`` every ``HEARTBEAT_INTERVAL_S`` until cancelled."""
    while True:
        # sleep: the heartbeat's period; what it proves is that this loop still turns
        await asyncio.sleep(HEARTBEAT_INTERVAL_S)
        try:
            touch(path)
        except OSError as error:
            # Left to go stale, the probe reports it; the worker itself goes on.
            log.warning("cannot touch the heartbeat file %s: %s", path, first_line(error))


def remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
