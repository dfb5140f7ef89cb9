"""Run ids and lease tokens: ULIDs, 26 characters that sort in mint order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from jobrun._core.model.formats import parse_instant

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class UlidMint:
    """Mints 26-character ULIDs that sort in the order they were minted.

    Within one millisecond (or when the wall clock steps back) the random part
    is incremented rather than redrawn, so ``ORDER BY id`` is mint order within
    a process, which the due read and the newest-first read rely on. The time
    and the randomness are handed in (``jobrun._host.system`` hands in the real ones).
    """

    def __init__(
        self, milliseconds: Callable[[], int], random_bytes: Callable[[int], bytes]
    ) -> None:
        self._milliseconds = milliseconds
        self._random_bytes = random_bytes
        self._last_ms = -1
        self._last_random = 0
        # Ids may be minted from several threads (one event loop each).
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            now_ms = self._milliseconds()
            if now_ms <= self._last_ms:
                now_ms = self._last_ms
                self._last_random += 1
                if self._last_random >= 1 << 80:
                    raise OverflowError("more than 2**80 ids minted in one millisecond")
            else:
                self._last_ms = now_ms
                self._last_random = int.from_bytes(self._random_bytes(10), "big")
            return _ulid_text((now_ms << 80) | self._last_random)


def first_id_at(instant_text: str) -> str:
    """The smallest ULID minted at or after the stored instant ``instant_text``.

    Its first 10 characters are the millisecond, so ``id >= first_id_at(t)`` is a
    range on the primary key for "minted at or after t".
    """
    moment = parse_instant(instant_text)
    milliseconds = max(0, (moment - _UNIX_EPOCH) // timedelta(milliseconds=1))
    return _base32(milliseconds, 10) + "0" * 16


_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Every two-digit pair, by its 10-bit value: a 130-bit id is 13 look-ups.
_PAIRS = tuple(high + low for high in _CROCKFORD for low in _CROCKFORD)
_PAIR_SHIFTS = tuple(range(120, -1, -10))


def _ulid_text(number: int) -> str:
    """``_base32(number, 26)`` for a 130-bit number, two digits per look-up: minting is
    paid once per start, thousands of times per batch (base64's b32encode, in pure
    Python on 3.11, took eight times as long)."""
    pairs = _PAIRS
    return "".join([pairs[(number >> shift) & 1023] for shift in _PAIR_SHIFTS])


def _base32(number: int, width: int) -> str:
    digits = []
    for _ in range(width):
        digits.append(_CROCKFORD[number & 31])
        number >>= 5
    return "".join(reversed(digits))
