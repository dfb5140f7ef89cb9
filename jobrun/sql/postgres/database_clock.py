"""Which leases a store judges and counts on the database's clock (Postgres).

A driver on real time claims on the database's clock: the claim's expiry test,
the expiry it writes, every renewal and a lease handed to the driver's next pass
are all decided in the statement by Postgres (see ``docs/design.md``, "Clock
steps"). A driver on a test clock keeps its own time. The store remembers the
tokens of the first kind, so each renewal takes the same clock as its claim.
"""

from __future__ import annotations

# Tokens of finished passes are dropped on the way; past this many the oldest go
# (a forgotten token only renews on the caller's clock, as before this existed).
MOST_REMEMBERED = 100_000


class DatabaseClockLeases:
    """The lease tokens claimed on the database's clock, oldest first."""

    def __init__(self) -> None:
        self._tokens: dict[str, None] = {}

    def __contains__(self, token: object) -> bool:
        return token in self._tokens

    def remember(self, token: str) -> None:
        self._tokens[token] = None
        if len(self._tokens) > MOST_REMEMBERED:
            del self._tokens[next(iter(self._tokens))]

    def hand_on(self, token: str, successor: str) -> bool:
        """A pass of lease ``token`` hands its lease on as ``successor``: whether that
        one is on the database's clock too."""
        if token not in self._tokens:
            return False
        self.remember(successor)
        return True

    def forget(self, token: str) -> None:
        self._tokens.pop(token, None)
