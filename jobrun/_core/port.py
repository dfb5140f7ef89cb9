"""The store port: the eight operations a backend supplies, and their contract.

The pass engine and the driver speak only to this protocol. ``SqlJobRunStore``
implements it for SQLite and Postgres; ``jobrun.testing.MemoryJobRunStore`` for
tests. A store raises :class:`jobrun.errors.StoreError` (original as
``__cause__``) when its backend fails, and nothing else for backend trouble.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from jobrun._core.records import RunFilter, RunPatch, RunRow, StepRow

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_MAX_STEP_RESULT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Size caps, in bytes of UTF-8 JSON text, enforced before anything is written."""

    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_cursor_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_step_result_bytes: int = DEFAULT_MAX_STEP_RESULT_BYTES

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_cursor_bytes", "max_step_result_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


class JobRunStore(Protocol):
    """Durable storage for runs and the step ledger of the pass in flight."""

    @property
    def limits(self) -> StoreLimits:
        """The size caps callers must enforce before writing."""
        ...

    @property
    def default_scope(self) -> object:
        """What ``await p.scope()`` returns when the host supplies no ``open_scope``."""
        ...

    async def start_or_join(self, row: RunRow) -> tuple[RunRow, bool]:
        """Atomically insert ``row`` unless a ``running`` row has the same key.

        Returns ``(row, True)`` when inserted, else ``(live_row, False)`` with the
        live row unchanged. Atomic across connections, processes and hosts: two
        callers can never both insert a live row for one key. A run that is done
        or failed never blocks a new one.
        """
        ...

    async def get(self, run_id: str) -> RunRow | None:
        """One run by id, whatever its status; ``None`` when absent."""
        ...

    async def due(self, now_at: str, limit: int, after_id: str | None) -> list[RunRow]:
        """Running rows whose ``next_attempt_at`` is NULL or ``<= now_at``.

        Only ids greater than ``after_id`` when it is given; oldest id first; at
        most ``limit`` rows.
        """
        ...

    async def list(self, run_filter: RunFilter) -> list[RunRow]:
        """Rows equal to every given filter field, newest id first, ``limit`` at most."""
        ...

    async def patch(self, run_id: str, patch: RunPatch) -> None:
        """Write every field of ``patch`` to the run (a failed pass). The ledger stays."""
        ...

    async def commit_pass(self, run_id: str, patch: RunPatch) -> None:
        """Write ``patch`` AND delete the run's whole ledger, in one transaction.

        If these could come apart, a step name reused by the next pass would
        find the previous pass's memo and skip work it never did.
        """
        ...

    async def steps(self, run_id: str) -> dict[str, StepRow]:
        """The run's whole ledger (one pass's steps at most), by step name."""
        ...

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str) -> None:
        """Insert or overwrite one ledger row; durable when this returns.

        Called once per finished step attempt, before the next step starts, so
        a kill loses at most the step in flight.
        """
        ...
