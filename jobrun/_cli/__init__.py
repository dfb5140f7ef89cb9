"""The ``jobrun`` command: migrations, run inspection, operator actions, the worker.

Exit codes: 0 success, 1 failure (the operation failed or found a problem),
2 usage error (bad arguments, as click reports them).
"""

from __future__ import annotations

from jobrun._cli.app import main

__all__ = ["main"]
