"""Schedules: which instants (slots) a cron expression names, and which of them to start.

A slot is an instant in UTC. Slots are found with croniter, walking back from
"now", so a worker that was down for a year does the same bounded work as one
that was down for a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobrun._core.model.names import require_name
from jobrun._core.model.queue_safety import DEFAULT_MAX_PAYLOAD_BYTES, encode_queue_safe
from jobrun._core.model.records import priority_value
from jobrun._core.model.refusals import checked_str, refuse

CATCH_UP_POLICIES = ("latest", "all", "none")
MAX_CATCH_UP_SLOTS = 100
"""``catch_up="all"`` starts at most this many missed slots (the newest ones)."""
ON_TIME_S = 30.0
"""A slot started within this many seconds of its instant was not missed (``"none"``)."""
_JUST_AFTER = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Schedule:
    """One registered schedule. ``instance`` ``None``: each slot's run is its own instance."""

    module_id: str
    job: str
    cron: str
    payload: Any
    catch_up: str
    instance: str | None
    priority: int

    @property
    def key(self) -> tuple[str, str, str]:
        """The stored key: the shared instance, or ``''`` for one instance per slot."""
        return (self.module_id, self.job, self.instance or "")

    def next_slot(self, now: datetime) -> datetime:
        """The first slot strictly after ``now``."""
        from croniter import croniter  # only hosts with schedules pay its import

        found: datetime = croniter(self.cron, now, ret_type=datetime).get_next()
        return found

    def due_slots(self, after: datetime, now: datetime) -> list[datetime]:
        """Slots in ``(after, now]``, oldest first, the newest ``MAX_CATCH_UP_SLOTS`` at most."""
        from croniter import croniter  # only hosts with schedules pay its import

        # Walked back from just after now so a slot exactly at now is found; one less
        # than that interval ahead is found too and skipped (not yet due: a timer that
        # fires early must not start, and stamp, a run before its slot).
        walk = croniter(self.cron, now + _JUST_AFTER, ret_type=datetime)
        found: list[datetime] = []
        while len(found) < MAX_CATCH_UP_SLOTS:
            slot: datetime = walk.get_prev()
            if slot <= after:
                break
            if slot <= now:
                found.append(slot)
        found.reverse()
        return found

    def slots_to_start(self, after: datetime, now: datetime) -> list[datetime]:
        """Which due slots to start, per ``catch_up``.

        Every due slot but the newest was missed (its successor has come too); the
        newest was missed when more than ``ON_TIME_S`` have passed since it.
        """
        due = self.due_slots(after, now)
        if not due or self.catch_up == "all":
            return due
        newest = due[-1]
        if self.catch_up == "latest":
            return [newest]
        on_time = (now - newest).total_seconds() <= ON_TIME_S
        return [newest] if on_time else []


def make_schedule(
    module_id: str,
    job: str,
    cron: str,
    payload: Any,
    catch_up: str,
    instance: str | None,
    priority: int,
) -> Schedule:
    """A checked :class:`Schedule`; a bad argument is refused with what was wrong."""
    require_name(module_id, "module_id")
    require_name(job, "job")
    checked_str(cron, "cron")
    from croniter import croniter  # only hosts with schedules pay its import

    if not croniter.is_valid(cron):
        raise refuse(
            "cron",
            "not a valid cron expression",
            message=f"cron {cron!r} is not a cron expression croniter reads "
            "(five fields, or six with seconds last)",
        )
    if catch_up not in CATCH_UP_POLICIES:
        raise refuse(
            "catch_up",
            f"{catch_up!r} is not a policy",
            message=f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}",
        )
    if instance is not None:
        require_name(instance, "instance")
    # Checked now so a bad payload fails at start-up, not at the first slot.
    encode_queue_safe(payload, "payload", DEFAULT_MAX_PAYLOAD_BYTES)
    return Schedule(module_id, job, cron, payload, catch_up, instance, priority_value(priority))
