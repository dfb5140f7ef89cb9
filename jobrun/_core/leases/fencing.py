"""Fences for the world outside the database: idempotency keys that replays share.

Inside the database every holder write is fenced on the lease token. A write to
an outside system (a payments API, another store) cannot be fenced on that
token, so a pass offers two values the outside system can check instead: the
run's fencing epoch (``JobPass.lease_epoch``, stored with the run and raised by
every claim) and an idempotency key per step, built here.
"""

from __future__ import annotations

import hashlib
import re

_STEP_DIGEST_CHARS = 16
_RUN_ID_CHARS = 26
# A run id as jobrun mints it (a ULID); anything else is hashed into that shape.
_PLAIN_RUN_ID = re.compile(r"[0-9A-Za-z]{1,26}")


def idempotency_key(run_id: str, pass_number: int, step: str) -> str:
    """``<run id>-p<pass number>-<16 hex digits of the SHA-256 of step, as UTF-8>``.

    ASCII letters, digits and ``-`` only, and at most 55 characters however long
    the step name, so APIs that limit their keys accept it. A run id that is not
    a plain ULID (a row written by hand) is replaced by 26 hex digits of its own
    SHA-256, for the same reason.
    """
    if not _PLAIN_RUN_ID.fullmatch(run_id):
        encoded = run_id.encode("utf-8", "surrogatepass")
        run_id = hashlib.sha256(encoded).hexdigest()[:_RUN_ID_CHARS]
    digest = hashlib.sha256(step.encode("utf-8")).hexdigest()[:_STEP_DIGEST_CHARS]
    # 26 + 2 + at most 10 digits (the column is a 32-bit INTEGER) + 1 + 16.
    return f"{run_id}-p{pass_number}-{digest}"
