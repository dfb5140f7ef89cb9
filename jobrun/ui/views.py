"""Rendering: the Jinja environment (autoescaped: everything from a database is user
data) and the small formatting filters the templates use."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobrun._core import COUNT_CAP, parse_instant, span
from jobrun.ui.databases import Database
from jobrun.ui.security import CSRF_FIELD, Guard

HERE = Path(__file__).parent
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def instant(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def stored(text: str | None) -> str:
    """A stored instant as the pages show instants (empty when absent or unreadable)."""
    if not text:
        return ""
    try:
        return instant(parse_instant(text))
    except (ValueError, OverflowError):
        return text


def number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def capped(count: int) -> str:
    return f"{COUNT_CAP:,}+" if count >= COUNT_CAP else f"{count:,}"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def shorten(text: str | None, limit: int = 120) -> str:
    if not text:
        return ""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


SHORT_ID_CHARS = 8


def short_id(run_id: str) -> str:
    """A run id as the runs list shows it: its last characters (a ULID's random part,
    which tells runs of one millisecond apart); the whole id is in the link."""
    return run_id if len(run_id) <= SHORT_ID_CHARS + 1 else "…" + run_id[-SHORT_ID_CHARS:]


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        span=span,
        instant=instant,
        stored=stored,
        number=number,
        capped=capped,
        pretty=pretty,
        shorten=shorten,
        short_id=short_id,
    )
    return environment


@dataclass(frozen=True, slots=True)
class Pages:
    """Renders whole pages and fragments with what every page needs."""

    guard: Guard
    databases: list[Database]
    poll_interval_ms: int
    environment: Environment

    @classmethod
    def build(cls, guard: Guard, databases: list[Database], poll_interval_ms: int) -> Pages:
        return cls(guard, databases, poll_interval_ms, _environment())

    async def render(
        self, request: Request, template: str, context: Mapping[str, Any], status: int = 200
    ) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        page = self.environment.get_template(template).render(
            base=base,
            csrf_field=CSRF_FIELD,
            csrf_token=self.guard.token_for(request),
            read_only=self.guard.read_only,
            banner=self.guard.banner,
            can=await self.guard.abilities(request),
            databases=self.databases,
            poll_interval_ms=self.poll_interval_ms,
            **context,
        )
        response = HTMLResponse(page, status_code=status)
        response.headers["content-security-policy"] = CONTENT_SECURITY_POLICY
        response.headers["x-content-type-options"] = "nosniff"
        response.headers["referrer-policy"] = "same-origin"
        response.headers["cache-control"] = "no-store"
        self.guard.set_cookie(request, response)
        return response
