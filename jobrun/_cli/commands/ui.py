"""``jobrun ui``: serve the operator console (:mod:`jobrun.ui`) with uvicorn."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, replace
from typing import Any

import click

from jobrun._cli.app import cli
from jobrun._cli.connect import (
    URL_ENVVAR,
    OneLineUsageError,
    first_line,
    make_engine,
    missing_sqlite_message,
    parse_url,
    refuse_unusable_schema,
    schema_option,
    shown_url,
    sqlite_file,
)
from jobrun.errors import JobValidationError


@dataclass(frozen=True, slots=True)
class _Serving:
    """How ``jobrun ui`` listens and what it answers to, checked before any database opens."""

    host: str
    port: int
    read_only: bool
    base: str
    root: str
    allowed_hosts: tuple[str, ...]
    forwarded_allow_ips: str


def _checked(serving: _Serving) -> _Serving:
    """``serving`` with its paths normalised and its default hosts filled in; a
    one-line usage error for what the console could not serve."""
    from jobrun.ui.hosts import LOOPBACK_HOSTS, AllowedHosts, is_loopback
    from jobrun.ui.paths import checked_base_path
    from jobrun.ui.proxying import TrustedProxies

    allowed = serving.allowed_hosts
    if not allowed:
        if not is_loopback(serving.host):
            raise OneLineUsageError(
                f"--host {serving.host} is reachable from other machines: name the host "
                "names browsers use to reach the console with --allowed-host "
                "(e.g. --allowed-host jobs.example.com)"
            )
        allowed = LOOPBACK_HOSTS
    try:
        AllowedHosts.of(allowed, "--allowed-host")
        TrustedProxies(serving.forwarded_allow_ips)
        base = checked_base_path(serving.base, "--base-path")
        root = checked_base_path(serving.root, "--root-path")
    except JobValidationError as error:
        raise OneLineUsageError(error.message) from error
    return replace(serving, base=base, root=root, allowed_hosts=allowed)


def _application(stores: dict[str, Any], serving: _Serving) -> Any:
    from jobrun.ui import create_app
    from jobrun.ui.proxying import ForwardedHeaders, TrustedProxies

    web_console = create_app(
        stores,
        read_only=serving.read_only,
        allowed_hosts=serving.allowed_hosts,
        base_path=serving.base,
    )
    trusted = TrustedProxies(serving.forwarded_allow_ips)
    return ForwardedHeaders(web_console, trusted) if trusted else web_console


async def _serve(urls: tuple[str, ...], schema: str | None, serving: _Serving) -> None:
    import uvicorn

    from jobrun.sql.store import SqlJobRunStore

    engines = []
    stores = {}
    try:
        for url in urls:
            parsed = parse_url(url)
            engine = make_engine(parsed)
            engines.append(engine)
            refuse_unusable_schema(engine, schema)
            path = sqlite_file(parsed)
            if path is not None and not path.exists():
                raise click.ClickException(missing_sqlite_message(path, url))
            name = shown_url(parsed) if schema is None else f"{shown_url(parsed)} schema {schema}"
            stores[name] = SqlJobRunStore(engine, schema=schema)
        config = uvicorn.Config(
            _application(stores, serving),
            host=serving.host,
            port=serving.port,
            log_level="info",
            lifespan="off",
            proxy_headers=False,  # ForwardedHeaders does it, the Host included
            root_path=serving.root,
        )
        _audit_to_stderr()
        shown_host = f"[{serving.host}]" if ":" in serving.host else serving.host
        address = f"http://{shown_host}:{serving.port}{serving.base}/"
        click.echo(f"jobrun console on {address} (Ctrl-C stops it)")
        await uvicorn.Server(config).serve()
    finally:
        for engine in engines:
            await engine.dispose()


def _audit_to_stderr() -> None:
    """Each console action's ``jobrun.ui`` record, one line on standard error: an
    operator running ``jobrun ui`` has no logging set up of their own, and the
    record is the only trace of who cancelled what."""
    import logging
    import sys

    logger = logging.getLogger("jobrun.ui")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # one line, not one more through a handler on the root


@cli.command("ui")
@click.option(
    "--url", "urls", multiple=True, required=True, envvar=URL_ENVVAR, show_envvar=True,
    metavar="URL", help="A database to show; repeat for several.",
)  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--read-only", is_flag=True, help="Show no action; refuse every state change.")
@click.option(
    "--allowed-host", "allowed_hosts", multiple=True, metavar="HOST[:PORT]",
    help="A host name browsers reach the console by (any port unless given); repeat for "
    "several. Other Host headers get 400. Default on a loopback --host: localhost, "
    "127.0.0.1 and ::1; required on any other.",
)  # fmt: skip
@click.option(
    "--base-path", default="/", show_default=True, metavar="PATH",
    help="Serve the console under this path, e.g. /jobs behind a proxy that keeps the path.",
)  # fmt: skip
@click.option(
    "--root-path", default="/", show_default=True, metavar="PATH",
    help="The path prefix a proxy in front strips before passing requests on; links get it.",
)  # fmt: skip
@click.option(
    "--forwarded-allow-ips", default="", metavar="IPS",
    help="Comma-separated proxy addresses or networks (or '*') whose X-Forwarded-For, "
    "-Proto and -Host headers are believed. Default: none.",
)  # fmt: skip
@schema_option
def ui(
    urls: tuple[str, ...],
    host: str,
    port: int,
    read_only: bool,
    allowed_hosts: tuple[str, ...],
    base_path: str,
    root_path: str,
    forwarded_allow_ips: str,
    schema: str | None,
) -> None:
    """Serve the operator console: runs, one run live, health; act on runs.

    Listens on 127.0.0.1 unless told otherwise, and answers only requests for the
    host names --allowed-host names (localhost by default), which keeps
    DNS-rebinding sites out. It has no login of its own: whoever reaches the port
    may act on runs unless --read-only is given. To put it behind your own
    authentication, mount `jobrun.ui.create_app` in your ASGI application instead.

    \b
    With --schema, every database shows that tenant's runs only.

    \b
    Example:
      jobrun ui --url sqlite+aiosqlite:///app.db --port 8080 --read-only
      jobrun ui --url postgresql://app@db.internal/app --schema tenant_a
      jobrun ui --url postgresql://app@db.internal/app --root-path /jobs \\
          --allowed-host jobs.example.com --forwarded-allow-ips 127.0.0.1
    """
    try:  # first: checking the options imports the console, which needs the extra
        import uvicorn  # noqa: F401

        import jobrun.ui  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            f"the console needs the ui extra: pip install 'jobrun[ui]' ({first_line(error)})"
        ) from None
    serving = _checked(
        _Serving(host, port, read_only, base_path, root_path, allowed_hosts, forwarded_allow_ips)
    )
    _refuse_busy_port(serving.host, serving.port)
    asyncio.run(_serve(urls, schema, serving))


def _refuse_busy_port(host: str, port: int) -> None:
    """One line, before any URL is printed, when ``host:port`` cannot be listened on."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As uvicorn binds: SO_REUSEADDR, so a port left in TIME_WAIT is not "in use".
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {error.strerror or first_line(error)}"
        ) from None
