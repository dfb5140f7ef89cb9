"""Which ``Host`` names the console answers to: the defence against DNS rebinding.

A site that makes its own name resolve to the console's address gets the
browser to send it the console's pages as same-origin: its ``Origin`` then equals
the ``Host`` it sent, so comparing the two proves nothing. Only a list of the
names the console is really reached by does; a request for any other name gets a
one-line 400 before any page (and so any CSRF token) is rendered.

An allowed name without a port matches that name on any port (a rebinding site
cannot choose the name, and the port is the console's own); with a port it
matches that port only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobrun._core import refuse

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""What a console bound to a loopback address answers to unless told otherwise."""

_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")

HostAndPort = tuple[str, int | None]


def _ip_text(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def split_host(text: str, *, bare_ipv6: bool = False) -> HostAndPort | None:
    """``(name, port)`` of a Host header (``name``, ``name:port``, ``[v6]:port``), the
    name lower-cased, an IP address in its canonical form; ``None`` if malformed."""
    text = text.strip().lower()
    port_text = None
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
        if _ip_text(name) is None or ":" not in name:
            return None
    elif bare_ipv6 and text.count(":") > 1:
        name = text
    else:
        name, colon, port_text_found = text.partition(":")
        port_text = port_text_found if colon else None
    port = None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    name = name.removesuffix(".")
    canonical = _ip_text(name)
    if canonical is not None:
        return canonical, port
    return (name, port) if _NAME.fullmatch(name) else None


def is_loopback(host: str) -> bool:
    """Whether a listening address (``--host``) is reachable from this machine only."""
    if host.lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """The names (and, where given, ports) the console answers to."""

    entries: frozenset[HostAndPort]

    @classmethod
    def of(cls, given: Iterable[str], path: str = "allowed_hosts") -> AllowedHosts:
        if isinstance(given, str):
            given = [given]
        entries = set()
        for text in given:
            if not isinstance(text, str) or "*" in text:
                raise refuse(
                    path,
                    f"has {text!r}: name each host (a wildcard lets a DNS-rebinding site in)",
                )
            parsed = split_host(text, bare_ipv6=True)
            if parsed is None:
                raise refuse(path, f"has {text!r}, which is not a host name, IP or host:port")
            entries.add(parsed)
        if not entries:
            raise refuse(path, "names no host; give None to serve read-only instead")
        return cls(frozenset(entries))

    def allows(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        parsed = split_host(host_header)
        if parsed is None:
            return False
        return parsed in self.entries or (parsed[0], None) in self.entries


def _host_header(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            text: str = value.decode("latin-1")
            return text
    return None


class HostGuard:
    """ASGI middleware: a request whose ``Host`` is not allowed gets a one-line 400."""

    def __init__(self, app: Any, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _host_header(scope)
        if self.allowed.allows(host):
            await self.app(scope, receive, send)
            return
        shown = repr(host)[:100] if host is not None else "none"
        body = f"refused: this console does not answer to the host {shown}\n".encode()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})
