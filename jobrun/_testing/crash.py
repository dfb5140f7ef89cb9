"""Crash injection: a store that dies like a killed process after N steps are recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobrun._core import BootLease, RunPatch, StepRow, is_int, refuse


class SimulatedCrash(BaseException):
    """The process "died" (raised by a :class:`CrashingStore`).

    A ``BaseException``, like a kill: job code's ``except Exception`` does not
    swallow it, and the pass gets no chance to write anything more.
    """


@dataclass(frozen=True, slots=True)
class CrashAfter:
    """Kill the first pass that records its ``steps``-th step, right after that write."""

    steps: int

    def __post_init__(self) -> None:
        if not is_int(self.steps) or self.steps < 1:
            raise refuse(
                "steps",
                f"must be an int of at least 1, got {self.steps!r}",
                message=f"CrashAfter needs a step count of at least 1, got {self.steps!r}",
            )


def crash_after_step(steps: int) -> CrashAfter:
    """Kill the pass right after its ``steps``-th step is recorded (see :class:`CrashAfter`)."""
    return CrashAfter(steps)


class CrashingStore:
    """A store that passes everything through until ``plan.steps`` step records landed;
    then it raises :class:`SimulatedCrash` and refuses every later write, as a dead
    process would: the lease stays held until it expires, the ledger keeps the steps."""

    def __init__(self, inner: Any, plan: CrashAfter) -> None:
        self.inner = inner
        self.plan = plan
        self.recorded = 0
        self.crashed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _alive(self) -> None:
        if self.crashed:
            raise SimulatedCrash("the process is dead")

    async def record_step(self, run_id: str, row: StepRow, recorded_at: str, token: str) -> bool:
        """Record the step, then die if it was the planned last one."""
        self._alive()
        written: bool = await self.inner.record_step(run_id, row, recorded_at, token)
        if written:
            self.recorded += 1
            if self.recorded >= self.plan.steps:
                self.crashed = True
                raise SimulatedCrash(f"killed after {self.recorded} recorded step(s)")
        return written

    async def patch(self, run_id: str, patch: RunPatch, token: str) -> bool:
        """Record a failed pass, unless the process is already dead."""
        self._alive()
        result: bool = await self.inner.patch(run_id, patch, token)
        return result

    async def commit_pass(self, run_id: str, patch: RunPatch, token: str) -> bool:
        """Commit the pass, unless the process is already dead."""
        self._alive()
        result: bool = await self.inner.commit_pass(run_id, patch, token)
        return result

    async def extend_lease(
        self,
        run_id: str,
        token: str,
        expires_at: str,
        now_at: str,
        boot: BootLease | None = None,
    ) -> bool:
        """Renew the lease, unless the process is already dead (then it lapses)."""
        self._alive()
        result: bool = await self.inner.extend_lease(run_id, token, expires_at, now_at, boot)
        return result
