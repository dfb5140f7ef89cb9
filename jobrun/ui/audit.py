"""Who did what: one INFO record on the ``jobrun.ui`` logger per console action.

The record names the identity ``authorize`` saw (the ``user`` an authentication
middleware put in the request's scope, else ``anonymous``), the client address,
the action, the database and the run ids it touched; the same fields are
attributes of the record (``identity``, ``client``, ``action``, ``database``,
``run_ids``, ``refused_ids``) for a structured log handler.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.requests import Request

LOGGER = logging.getLogger("jobrun.ui")
_SHOWN_IDS = 20


def identity_of(request: Request) -> str:
    """The acting user's name, from the scope's ``user`` (Starlette's authentication)."""
    user = request.scope.get("user")
    if user is None or getattr(user, "is_authenticated", True) is False:
        return "anonymous"
    for attribute in ("display_name", "identity", "username", "name"):
        try:
            value = getattr(user, attribute, None)
        except NotImplementedError:  # Starlette's BaseUser leaves some unimplemented
            value = None
        if isinstance(value, str) and value:
            return value
    return str(user)


def log_action(
    request: Request,
    database: str,
    action: str,
    run_ids: Sequence[str],
    refused_ids: Sequence[str] = (),
) -> None:
    identity = identity_of(request)
    client = request.client.host if request.client else "unknown"
    shown = ", ".join(run_ids[:_SHOWN_IDS]) + (", ..." if len(run_ids) > _SHOWN_IDS else "")
    LOGGER.info(
        "console %s by %s from %s on %s: %d run(s) [%s], %d refused",
        action,
        identity,
        client,
        database,
        len(run_ids),
        shown,
        len(refused_ids),
        extra={
            "identity": identity,
            "client": client,
            "action": action,
            "database": database,
            "run_ids": tuple(run_ids),
            "refused_ids": tuple(refused_ids),
        },
    )
