"""Whether a job named on the command line is one a registry registers.

``jobrun start`` writes a row any name fits; a typo (``heartbeet``) would sit as
an ordinary running run that no worker ever drives. With ``--app`` the name is
checked against the registry the workers load; without it the user is told the
name went unchecked.
"""

from __future__ import annotations

import difflib

import click

from jobrun._core import JobRegistry


def warn_unchecked(module_id: str, job: str) -> None:
    """Say, after a start without ``--app``, that nothing checked the job's name."""
    click.echo(
        f"warning: {module_id}/{job} is not checked against any registry "
        "(give --app MODULE:REGISTRY to refuse a job no worker runs)",
        err=True,
    )


def check_registered(app: str, module_id: str, job: str) -> None:
    """Refuse ``module_id/job`` when ``app``'s registry lacks it (nothing is written)."""
    from jobrun._cli.worker_command import load_registry

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
