"""A worker's row as stored (revision 0007), and the stored form of its jobs.

A record, apart from the registry's rules (``operator.worker_registry``), so the
store port can name it without reaching up to the operator's reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

Job = tuple[str, str]
"""A job's ``(module_id, job)`` pair."""


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One worker's row as stored (times as stored text; ``jobs`` as :func:`jobs_text`)."""

    id: str
    name: str
    host: str
    pid: int
    jobs: str
    started_at: str
    heartbeat_at: str
    expires_at: str

    @property
    def job_pairs(self) -> list[Job]:
        """The ``(module_id, job)`` pairs the worker registers (none if unreadable)."""
        return jobs_of(self.jobs)


def jobs_text(jobs: Iterable[Job]) -> str:
    """The stored form of a worker's jobs: a JSON list of ``[module_id, job]``, sorted
    (a module id may itself hold ``/``)."""
    return json.dumps(sorted({(module_id, job) for module_id, job in jobs}), separators=(",", ":"))


def jobs_of(text: str) -> list[Job]:
    """The pairs of :func:`jobs_text`; a row written by hand that does not parse has none."""
    try:
        found = json.loads(text)
    except ValueError:
        return []
    if not isinstance(found, list):
        return []
    return [
        (str(pair[0]), str(pair[1])) for pair in found if isinstance(pair, list) and len(pair) == 2
    ]
