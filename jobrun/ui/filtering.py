"""The runs page's filter: from query parameters to a :class:`RunQuery`, and back to links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlencode

from jobrun._core import CANCELLED, FAILED, STRANDED, JobRunStatus, RunQuery, format_instant

STATUS_CHOICES = (*(member.value for member in JobRunStatus), CANCELLED, STRANDED)
"""What the status filter offers: ``failed`` means failed and not cancelled;
``cancelled`` the failed runs an operator cancelled."""
PAGE_SIZE = 50
_FIELDS = ("status", "module", "job", "instance", "since")


@dataclass(frozen=True, slots=True)
class RunsFilter:
    """What the operator typed, kept as typed (to fill the form again)."""

    status: str = ""
    module: str = ""
    job: str = ""
    instance: str = ""
    since: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> RunsFilter:
        return cls(**{name: params.get(name, "").strip()[:1000] for name in _FIELDS})

    def problems(self) -> list[str]:
        found = []
        if any("\x00" in getattr(self, name) for name in _FIELDS):
            found.append("the filter must not contain NUL characters")
        if self.status and self.status not in STATUS_CHOICES:
            found.append(f"status must be one of {', '.join(STATUS_CHOICES)}")
        if self.since and _since_at(self.since) is None:
            found.append("started since must be a date and time like 2026-01-31T08:00 (UTC)")
        return found

    def query(
        self, now: datetime, *, before_id: str | None = None, limit: int = PAGE_SIZE
    ) -> RunQuery:
        """The store query; call only when :meth:`problems` found none."""
        return RunQuery(
            module_id=self.module or None,
            job=self.job or None,
            instance_prefix=self.instance or None,
            statuses=_statuses(self.status),
            cancelled=_cancelled(self.status),
            started_since_at=_since_at(self.since) if self.since else None,
            stranded_at=format_instant(now) if self.status == STRANDED else None,
            before_id=before_id,
            limit=limit,
        )

    def with_status(self, status: str) -> RunsFilter:
        return replace(self, status=status)

    def params(self) -> dict[str, str]:
        return {name: value for name in _FIELDS if (value := getattr(self, name))}

    def encoded(self, **extra: str) -> str:
        return urlencode(self.params() | extra)


def _statuses(status: str) -> tuple[str, ...]:
    if status == CANCELLED:
        return (FAILED,)
    return (status,) if status in JobRunStatus._value2member_map_ else ()


def _cancelled(status: str) -> bool | None:
    return {CANCELLED: True, FAILED: False}.get(status)


def _since_at(text: str) -> str | None:
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        # An offset can carry a date at either end of the calendar past its edge.
        return format_instant(moment)
    except (ValueError, OverflowError):
        return None
