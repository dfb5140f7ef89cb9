"""Behind a reverse proxy: ``X-Forwarded-For``, ``-Proto`` and ``-Host``, from trusted peers only.

Like uvicorn's ``ProxyHeadersMiddleware`` (``--forwarded-allow-ips``), with the
host too: a request whose direct peer is a trusted proxy has its client address,
scheme and ``Host`` replaced by what the proxy says; from any other peer the
headers are ignored, so a client cannot claim another host or address. The
``Host`` check (:mod:`jobrun.ui.hosts`) then sees the host the browser asked for.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from jobrun._core import refuse

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """Addresses and networks (``10.0.0.0/8``) whose forwarded headers are believed;
    ``*`` believes every peer."""

    def __init__(self, given: str) -> None:
        items = [item.strip() for item in given.split(",") if item.strip()]
        self.everyone = items == ["*"]
        self.networks: list[Network] = []
        if self.everyone:
            return
        for item in items:
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise refuse(
                    "forwarded_allow_ips",
                    f"has {item!r}, which is not an IP address or network (or a lone '*')",
                ) from None

    def __bool__(self) -> bool:
        return self.everyone or bool(self.networks)

    def trusts(self, address: str | None) -> bool:
        if self.everyone:
            return True
        if not address:
            return False
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client_of(self, forwarded_for: str) -> str | None:
        """The first address from the right that is not a trusted proxy."""
        hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return hops[0] if hops else None


def _last(value: bytes) -> str:
    """The value the nearest proxy set (each proxy appends to a list)."""
    return value.decode("latin-1").split(",")[-1].strip()


class ForwardedHeaders:
    """ASGI middleware applying the forwarded headers of trusted proxies."""

    def __init__(self, app: Any, trusted: TrustedProxies) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and self.trusted.trusts(peer and peer[0]):
            scope = self._forwarded(dict(scope))
        await self.app(scope, receive, send)

    def _forwarded(self, scope: dict[str, Any]) -> dict[str, Any]:
        headers = dict(scope["headers"])  # the last of a repeated header wins
        proto = _last(headers.get(b"x-forwarded-proto", b""))
        if proto in ("http", "https"):
            scope["scheme"] = proto if scope["type"] == "http" else proto.replace("http", "ws")
        forwarded_for = b", ".join(
            value for name, value in scope["headers"] if name == b"x-forwarded-for"
        ).decode("latin-1")
        client = self.trusted.client_of(forwarded_for)
        if client:
            scope["client"] = (client, 0)
        host = _last(headers.get(b"x-forwarded-host", b""))
        if host:
            scope["headers"] = [
                (name, value) for name, value in scope["headers"] if name != b"host"
            ] + [(b"host", host.encode("latin-1"))]
        return scope
