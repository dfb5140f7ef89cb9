"""Wall-clock steps under real drivers (issue 31 item 3): libfaketime, monotonic left alone.

Every driver runs with libfaketime preloaded, its wall clock offset by the
contents of a file of its own (re-read at each reading, so the offset can change
under a running process) while its monotonic clock stays real, as an NTP step or
a resumed VM leaves it. The fault waits for a body, then steps the wall clock of
the whole host (every driver; SQLite's drivers all live on one host), of one
client that does not hold the run, or of the holder itself.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tests.chaos.stage import Fault, Stage

# Debian's libfaketime (package ``libfaketime``; the ``faketime`` wrapper depends on it).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
WHOM = {"host": "the whole host", "client": "one client", "holder": "the holder"}


def faketime_missing() -> str | None:
    """Why a clock step cannot be staged here, or ``None``."""
    if not LIBFAKETIME.exists() or shutil.which("faketime") is None:
        return "libfaketime is not installed (Debian package faketime)"
    return None


class ClockStep(Fault):
    quick = True
    drivers = 3

    def __init__(self, whom: str, seconds: int, backends: tuple[str, ...]) -> None:
        self.whom, self.seconds, self.backends = whom, seconds, backends
        self.name = f"clock {seconds:+d} s, {WHOM[whom]}"
        self._files: dict[int, Path] = {}

    async def before_drivers(self, stage: Stage) -> None:
        for index in range(self.drivers):
            offset = self._files[index] = stage.workdir / f"d{index}.faketime"
            offset.write_text("+0\n")
            stage.driver_env[index] = {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(offset),
                # Re-read the file at every reading: the step lands mid-run.
                "FAKETIME_NO_CACHE": "1",
                "DONT_FAKE_MONOTONIC": "1",
            }

    async def inject(self, stage: Stage) -> None:
        victim, event = await stage.victim_body()
        holder = stage.children.index(victim)
        for index, offset in self._files.items():
            stepped = (
                self.whom == "host"
                or (self.whom == "holder" and index == holder)
                or (self.whom == "client" and index != holder)
            )
            if stepped:
                offset.write_text(f"{self.seconds:+d}\n")
        stage.resume_from_ns = time.monotonic_ns()
        stage.affected_runs = {event["run"]}
        stage.notes.append(f"stepped at d{holder}'s body of {event['step']}")


def clock_steps() -> list[ClockStep]:
    return [
        ClockStep("host", 90, ("sqlite",)),
        ClockStep("host", -90, ("sqlite",)),
        ClockStep("client", 90, ("postgres",)),
        ClockStep("holder", -90, ("postgres",)),
    ]
