"""A lease holder, or a check of one, for ``tests/processes/test_holder_namespaces.py``
(not a test module). Run it inside ``unshare``/``nsenter`` to put it in namespaces.

* ``hold``: print one JSON line (``identity``: this process's identity as a claim
  stores it; ``proc_self``: what ``/proc/self`` names, the pid under the mounted
  ``/proc``), then wait until stdin closes.
* ``check TEXT``: print what this process can tell about the holder ``TEXT``
  names: ``dead``, ``alive`` or ``unknown``.
* ``pair``: start a ``hold`` child in this process's namespaces, check it while it
  lives, kill and reap it, check again; print one JSON line with both answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from jobrun._core.leases.holders import parse_holder
from jobrun._host.system import liveness_on_this_host, local_identity


def hold() -> None:
    print(
        json.dumps(
            {
                "identity": local_identity().describe("holder"),
                "proc_self": os.readlink("/proc/self"),
            }
        ),
        flush=True,
    )
    sys.stdin.read()


def check(text: str) -> str:
    holder = parse_holder(text)
    assert holder is not None, text
    return liveness_on_this_host(holder).value


def pair() -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "hold"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    text = json.loads(child.stdout.readline())["identity"]
    while_alive = check(text)
    child.kill()
    child.communicate()
    print(json.dumps({"identity": text, "alive": while_alive, "dead": check(text)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold()
    elif sys.argv[1] == "check":
        print(check(sys.argv[2]), flush=True)
    else:
        pair()
