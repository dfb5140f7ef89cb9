"""The registry ``--app`` names, and whether a job named on the command line is one it registers.

``jobrun start`` writes a row any name fits; a typo (``heartbeet``) would sit as
an ordinary running run that no worker ever drives. With ``--app`` the name is
checked against the registry the workers load; without it the user is told the
name went unchecked.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Any

import click

from jobrun._cli.connect import first_line
from jobrun._core import JobRegistry


def load_registry(spec: str) -> JobRegistry:
    """``package.module:attribute`` (the attribute may be dotted) to the JobRegistry it names."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise click.BadParameter(
            f"{spec!r} is not of the form package.module:registry", param_hint="--app"
        )
    # Like other app servers: the working directory is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {first_line(error)}", param_hint="--app"
        ) from error
    except SyntaxError as error:  # the app's own file, where the user can fix it
        where = f"{error.filename}:{error.lineno}" if error.filename else "its source"
        raise click.BadParameter(
            f"cannot import {module_name!r}: {error.msg} at {where}", param_hint="--app"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as error:
            raise click.BadParameter(
                f"{module_name!r} has no attribute {attribute!r}", param_hint="--app"
            ) from error
    if not isinstance(found, JobRegistry):
        raise click.BadParameter(
            f"{spec} is a {type(found).__name__}, not a jobrun.JobRegistry", param_hint="--app"
        )
    return found


def warn_unchecked(module_id: str, job: str) -> None:
    """Say, after a start without ``--app``, that nothing checked the job's name."""
    click.echo(
        f"warning: {module_id}/{job} is not checked against any registry "
        "(give --app MODULE:REGISTRY to refuse a job no worker runs)",
        err=True,
    )


def check_registered(app: str, module_id: str, job: str) -> None:
    """Refuse ``module_id/job`` when ``app``'s registry lacks it (nothing is written)."""
    registry = load_registry(app)
    if registry.get(module_id, job) is not None:
        return
    raise click.BadParameter(
        f"{app} registers no job {module_id}/{job}{suggestion(registry, module_id, job)}",
        param_hint="MODULE JOB",
    )


def suggestion(registry: JobRegistry, module_id: str, job: str) -> str:
    """``"; did you mean shop/heartbeat?"`` for the nearest registered names, or ``""``."""
    names = [f"{entry.module_id}/{entry.name}" for entry in registry]
    if not names:
        return " (it registers no jobs)"
    near = difflib.get_close_matches(f"{module_id}/{job}", names, n=3, cutoff=0.8)
    if not near:
        return f" (it registers {len(names)} job{'' if len(names) == 1 else 's'})"
    return f"; did you mean {' or '.join(near)}?"
