"""The registry the many_databases scenario runs its worker with
(``--app benchmarks.processes.many_app:registry``).

``bench/pickup``: one pass that appends ``"<started> <picked>\\n"`` (wall-clock
seconds: when the benchmark started the run, when a driver began its pass) to
the file named by ``payload["log"]``, then is done.
"""

from __future__ import annotations

import os
import time

import jobrun

registry = jobrun.JobRegistry()


@registry.job("bench", "pickup")
async def pickup(p: jobrun.JobPass) -> jobrun.PassResult:
    picked = time.time()
    line = f"{p.payload['started']} {picked} {p.payload.get('label', '')}\n".encode()
    # O_APPEND: one short write per run, whole, whatever the other runs write.
    descriptor = os.open(p.payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)
    return jobrun.PassResult(done=True)
