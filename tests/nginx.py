"""A real nginx (Debian's package) as a child process of a test, never the system service.

Each :class:`Nginx` gets a prefix directory of its own (configuration, pid file,
error log, temp paths), listens on a port picked free for it, and runs in the
foreground (``daemon off``), so stopping it is ending the one process it started.
``.ci/run`` installs nginx when it is missing; a test that needs it and does not
find it fails under ``CI=true`` and is skipped, saying why, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

NGINX_PATHS = ("/usr/sbin/nginx",)


def nginx_binary() -> str:
    """The nginx executable; fails under CI (``.ci/run`` installs it), else skips."""
    found = shutil.which("nginx") or next((p for p in NGINX_PATHS if Path(p).exists()), None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("nginx is not installed (.ci/run installs it)")
        pytest.skip("nginx is not installed: apt-get install nginx")
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


_MAIN = """
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
{http}
    access_log {prefix}/access.log {log_format};
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
{server}
    }}
}}
"""


class Nginx:
    """One nginx serving ``server`` (the body of a ``server`` block) on a free port,
    with ``http`` added to its ``http`` block (a ``limit_req_zone``, for one) and
    its access log in ``log_format`` (one ``http`` defines; nginx's own if empty)."""

    def __init__(self, prefix: Path, server: str, http: str = "", log_format: str = "") -> None:
        self.prefix = prefix
        prefix.mkdir(parents=True, exist_ok=True)
        self.binary = nginx_binary()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._server = server
        self._http = http
        self._log_format = log_format

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 30.0) -> Nginx:
        # A port picked free can be taken by another test before nginx binds it:
        # then nginx exits at once, and another port is tried.
        for _ in range(5):
            self.port = free_port()
            config = self.prefix / "nginx.conf"
            config.write_text(
                _MAIN.format(
                    prefix=self.prefix,
                    port=self.port,
                    http=self._http,
                    server=self._server,
                    log_format=self._log_format,
                )
            )
            self.process = subprocess.Popen(
                [self.binary, "-p", str(self.prefix), "-c", str(config), "-e",
                 str(self.prefix / "error.log"), "-g", "daemon off; master_process off;"
                 + (" user root;" if os.geteuid() == 0 else "")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            if self._wait_listening(deadline_s):
                return self
        raise AssertionError(f"nginx did not start: {self.errors()}")

    def _wait_listening(self, deadline_s: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)  # polling for the listening socket; the deadline bounds it
        raise AssertionError(f"nginx not listening within {deadline_s} s: {self.errors()}")

    def errors(self) -> str:
        log = self.prefix / "error.log"
        return log.read_text()[-3000:] if log.exists() else ""

    def access_log(self) -> list[str]:
        log = self.prefix / "access.log"
        return log.read_text().splitlines() if log.exists() else []

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()

    def __enter__(self) -> Nginx:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# limit_req acts in the preaccess phase: an answer by ``return`` in the same
# location comes earlier (the rewrite phase) and would never be limited, so the
# answer is given in a named location reached after the limit.
LIMITED = """
    location /objects/ {{
        limit_req zone=api burst={burst} nodelay;
        limit_req_status 429;
        {answer}
    }}
    location @answer {{
        default_type application/json;
        return 200 '{{"id": 1, "size": 1}}';
    }}
"""
ANSWER = "try_files /nothing-here @answer;"


def limited_api(prefix: Path, rate: float | str, burst: int, upstream: str | None = None) -> Nginx:
    """nginx with one ``limit_req`` zone (every client one key) over ``/objects/``,
    answering itself, or passing what it lets through to ``upstream``; ``rate`` a
    second, or as nginx writes it (``"1r/m"``)."""
    answer = ANSWER if upstream is None else f"proxy_pass {upstream};"
    per_second = rate if isinstance(rate, str) else f"{rate:g}r/s"
    zone = (
        # When each request arrived: $msec is when it was logged, after the answer.
        "    log_format timed '$msec $status $request_time $remote_port $uri';\n"
        f"    limit_req_zone $server_port zone=api:1m rate={per_second};\n"
    )
    return Nginx(prefix, LIMITED.format(burst=burst, answer=answer), http=zone, log_format="timed")
