"""A chaos driver that is a real ``jobrun worker`` process (not a test module).

It takes the options of ``chaos_child.py`` and runs the same job, but driven by
the worker command instead of a ``run_due_jobs`` loop. Run as a script (as the
chaos stage starts a driver), it replaces itself with ``jobrun worker --app
tests.processes.chaos_worker:registry --url URL``, its options handed on in
``JOBRUN_CHAOS_OPTIONS`` (with the rest of its environment: a fault's
libfaketime settings, say); imported by that worker, it builds the registry
from them and prints ``ready``. Under libfaketime it gives ``time.sleep`` a
relative timeout (see below). The bodies print ``body`` events and write the
referee's log as in ``chaos_child.py``. A worker never stops by itself: the
fault stops it with SIGTERM once every run is done.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path

OPTIONS = "JOBRUN_CHAOS_OPTIONS"
APP = "tests.processes.chaos_worker:registry"


def _sleep(seconds: float) -> None:
    select.select([], [], [], seconds)


def exec_worker(argv: list[str]) -> None:
    url = argv[argv.index("--url") + 1]
    command = Path(sys.executable).with_name("jobrun")
    environment = dict(os.environ, **{OPTIONS: json.dumps(argv)})
    os.execve(command, [str(command), "worker", "--app", APP, "--url", url], environment)


if __name__ == "__main__":
    exec_worker(sys.argv[1:])
else:
    from tests.processes.chaos_child import (
        announce_first_judgement,
        emit,
        make_registry,
        parse,
    )

    announce_first_judgement()

    if "faketime" in os.environ.get("LD_PRELOAD", ""):
        # libfaketime with the monotonic clock left alone turns Python 3.11's
        # clock_nanosleep(TIMER_ABSTIME) into EINVAL (wolfcw/libfaketime#426): the
        # worker's watchdog thread would die at its first time.sleep. A select with
        # a relative timeout sleeps as the real clock does.
        time.sleep = _sleep

    _args = parse(json.loads(os.environ[OPTIONS]))
    _log_fd = os.open(_args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    registry = make_registry(_args, _log_fd)
    emit("ready", name=_args.name)
