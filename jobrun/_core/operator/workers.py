"""Who is running what: the leased runs grouped by the driver that holds them.

A claim writes into ``lease_driver`` the driver's name and its identity (see
:mod:`jobrun._core.leases.holders`); one driver process holds every lease it took under
one such text, so grouping by it gives one line per driver with its host and pid
(when it recorded them), how many runs it holds, since when and until when.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from jobrun._core.leases.holders import HolderIdentity, parse_holder
from jobrun._core.model.predicates import due_at
from jobrun._core.model.records import RunRow

_BRACKET_START = " [jobrun "
PRESENCE_APPLICATION = "jobrun presence"
"""How a presence session (Postgres) begins its ``application_name``."""
_APPLICATION_FIELD = re.compile(r"\b(host|pid)=(\S+)")


def driver_name(lease_driver: str) -> str:
    """The operator's part of a stored ``lease_driver``: the text before the identity."""
    cut = lease_driver.rfind(_BRACKET_START)
    return lease_driver if cut < 0 else lease_driver[:cut]


@dataclass(slots=True)
class Driver:
    """One lease holder as the leased runs show it (times as stored text).

    ``since_at`` is the oldest lease it holds began; ``expires_at`` the soonest of its
    leases expires (it renews them as its passes go on)."""

    lease_driver: str
    name: str
    identity: HolderIdentity | None
    runs: int = 0
    run_ids: list[str] = field(default_factory=list)
    jobs: set[tuple[str, str]] = field(default_factory=set)
    since_at: str | None = None
    expires_at: str | None = None

    @property
    def presence(self) -> int | None:
        return None if self.identity is None else self.identity.presence


def drivers_of(rows: Iterable[RunRow], keep_ids: int = 20) -> list[Driver]:
    """The holders of ``rows`` (leased runs), the one holding most first, then by name;
    each keeps up to ``keep_ids`` of its run ids."""
    found: dict[str, Driver] = {}
    for row in rows:
        if row.lease_driver is None:
            continue
        driver = found.get(row.lease_driver)
        if driver is None:
            driver = found[row.lease_driver] = Driver(
                row.lease_driver, driver_name(row.lease_driver), parse_holder(row.lease_driver)
            )
        driver.runs += 1
        if len(driver.run_ids) < keep_ids:
            driver.run_ids.append(row.id)
        driver.jobs.add((row.module_id, row.job))
        if row.lease_began_at is not None:
            driver.since_at = min(driver.since_at or row.lease_began_at, row.lease_began_at)
        # While a run is leased its due instant is the lease's expiry.
        expiry = due_at(row)
        driver.expires_at = min(driver.expires_at or expiry, expiry)
    return sorted(found.values(), key=lambda driver: (-driver.runs, driver.lease_driver))


@dataclass(frozen=True, slots=True)
class PresenceSeen:
    """A driver process's presence as Postgres shows it (see ``jobrun.sql.postgres.presence``):
    its key, the host and pid its session named, its client address, since when."""

    key: int
    host: str | None
    pid: int | None
    client: str | None
    since_at: str | None


def presence_seen(
    key: int, application: str, client: str | None, since_at: str | None
) -> PresenceSeen:
    """Read the host and pid a presence session wrote into its application name."""
    fields = dict(_APPLICATION_FIELD.findall(application or ""))
    pid = fields.get("pid", "")
    return PresenceSeen(
        key, fields.get("host"), int(pid) if pid.isdigit() else None, client, since_at
    )


def idle_presences(
    presences: Iterable[PresenceSeen], drivers: Iterable[Driver]
) -> list[PresenceSeen]:
    """The presences no holder of a lease names: live drivers that hold nothing now."""
    holding = {driver.presence for driver in drivers if driver.presence is not None}
    return [presence for presence in presences if presence.key not in holding]
