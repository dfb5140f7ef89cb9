"""``jobrun ui``: serve the operator console (:mod:`jobrun.ui`) with uvicorn."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from jobrun._cli.app import cli
from jobrun._cli.connect import (
    URL_ENVVAR,
    make_engine,
    parse_url,
    refuse_unusable_schema,
    schema_option,
    shown_url,
    sqlite_file,
)


def _base_path(text: str) -> str:
    path = "/" + text.strip("/")
    if path != "/" and any(part in ("", ".", "..") for part in path[1:].split("/")):
        raise click.BadParameter(
            f"{text!r} is not a plain path like /jobs", param_hint="--base-path"
        )
    return "" if path == "/" else path


def _application(web_console: Any, base: str) -> Any:
    if not base:
        return web_console
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Mount, Route

    async def to_console(request: Any) -> RedirectResponse:
        return RedirectResponse(f"{base}/", status_code=307)

    return Starlette(routes=[Route("/", to_console), Mount(base, app=web_console)])


async def _serve(
    urls: tuple[str, ...], schema: str | None, host: str, port: int, read_only: bool, base: str
) -> None:
    import uvicorn

    from jobrun.sql.store import SqlJobRunStore
    from jobrun.ui import create_app

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
                raise click.ClickException(
                    f"no SQLite database at {path}: create it with `jobrun db upgrade --url {url}`"
                )
            name = shown_url(parsed) if schema is None else f"{shown_url(parsed)} schema {schema}"
            stores[name] = SqlJobRunStore(engine, schema=schema)
        web_console = create_app(stores, read_only=read_only)
        config = uvicorn.Config(
            _application(web_console, base), host=host, port=port, log_level="info", lifespan="off"
        )
        click.echo(f"jobrun console on http://{host}:{port}{base}/ (Ctrl-C stops it)")
        await uvicorn.Server(config).serve()
    finally:
        for engine in engines:
            await engine.dispose()


@cli.command("ui")
@click.option(
    "--url", "urls", multiple=True, required=True, envvar=URL_ENVVAR, show_envvar=True,
    metavar="URL", help="A database to show; repeat for several.",
)  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--read-only", is_flag=True, help="Show no action; refuse every state change.")
@click.option(
    "--base-path", default="/", show_default=True, metavar="PATH",
    help="Serve the console under this path, e.g. /jobs behind a proxy.",
)  # fmt: skip
@schema_option
def ui(
    urls: tuple[str, ...],
    host: str,
    port: int,
    read_only: bool,
    base_path: str,
    schema: str | None,
) -> None:
    """Serve the operator console: runs, one run live, health; act on runs.

    Listens on 127.0.0.1 unless told otherwise. It has no login of its own:
    whoever reaches the port may act on runs unless --read-only is given. To put
    it behind your own authentication, mount `jobrun.ui.create_app` in your
    ASGI application instead.

    \b
    With --schema, every database shows that tenant's runs only.

    \b
    Example:
      jobrun ui --url sqlite+aiosqlite:///app.db --port 8080 --read-only
      jobrun ui --url postgresql://app@db.internal/app --schema tenant_a
    """
    base = _base_path(base_path)
    try:
        import uvicorn  # noqa: F401

        import jobrun.ui  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            f"the console needs the ui extra: pip install 'jobrun[ui]' ({error})"
        ) from error
    asyncio.run(_serve(urls, schema, host, port, read_only, base))
