"""jobrun's benchmarks and on-demand checks: ``python -m benchmarks`` lists them.

``harness/`` holds what they share, ``scenarios/`` one module each, ``processes/`` the
child processes and apps they start. With ``JOBRUN_BENCH_CODE=DIR`` in the environment,
DIR's ``jobrun`` is imported instead of this checkout's (another checkout's code under
the same scenario: a before and after); this package puts it first on the path before
anything imports jobrun, and children inherit it.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("JOBRUN_BENCH_CODE"):
    sys.path.insert(0, os.environ["JOBRUN_BENCH_CODE"])
