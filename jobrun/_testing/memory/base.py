"""What every facet of ``MemoryJobRunStore`` shares: the runs, their ledgers, the clock.

The memory store is cut as the SQL store is (``jobrun/sql/store/``): one class per
facet of the port, each a subclass of :class:`MemoryStoreBase`, which declares
the tables more than one facet reads (set once, by ``MemoryJobRunStore.__init__``).
A facet declares the tables only it keeps in its own class.
"""

from __future__ import annotations

from jobrun._core import Clock, RunRow, StepRow, is_live


class MemoryStoreBase:
    """The tables every facet of the memory store reads."""

    runs: dict[str, RunRow]
    # run id: {step name: (its ledger row, recorded at)}
    ledgers: dict[str, dict[str, tuple[StepRow, str]]]
    # What this "database" refills rate-limit buckets by.
    _clock: Clock
    # Revision 0009: (module_id, job) and limit key: (paused at, reason); read by
    # starts and takes, written by the pauses facet.
    job_pauses: dict[tuple[str, str], tuple[str, str | None]]
    limit_pauses: dict[str, tuple[str, str | None]]

    def _held(self, run_id: str, token: str) -> bool:
        """Whether ``token`` still holds run ``run_id``: the fence of a holder's writes."""
        row = self.runs.get(run_id)
        return row is not None and is_live(row) and row.lease_owner == token
