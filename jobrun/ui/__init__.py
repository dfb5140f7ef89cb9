"""The operator console: see, follow and act on runs in a browser.

Needs the ``ui`` extra (``pip install 'jobrun[ui]'``). Run it with ``jobrun ui
--url URL``, or mount it in any ASGI application::

    from jobrun.ui import create_app

    app.mount(
        "/jobs",
        create_app({"main": engine}, authorize=may_operate, allowed_hosts=["jobs.example.com"]),
    )

Screens: runs (filters, keyset pages, counts per status, bulk actions), one run
(record, counters with rates and progress, lease, step ledger; live while it
runs) and health (per database and per job).
"""

from __future__ import annotations

from jobrun.ui.app import create_app
from jobrun.ui.security import ACTIONS, Authorize

__all__ = ["ACTIONS", "Authorize", "create_app"]
