"""Who may see and act, and proof that a state change came from the console's own page.

Every request must name an allowed ``Host`` (:mod:`jobrun.ui.hosts`); every
page, fragment and static file must pass ``authorize(request, "view")``. Every
state change is a POST that must pass, in order: not read-only; an ``Origin``
(or, lacking one, a ``Referer``) naming this host, which must be an allowed one,
or a trusted origin; a CSRF token matching the browser's cookie; and
``authorize(request, action)``.

The CSRF token is a signed double submit: the cookie holds a random nonce, the
form holds an HMAC of that nonce under a key only this process knows, so a
cookie planted from a sibling domain does not yield a valid form token.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeAlias
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from jobrun.ui.hosts import AllowedHosts

VIEW = "view"
ACTIONS = ("cancel", "resume", "release", "start", "pause", "unpause")
"""What ``authorize`` is asked about besides ``"view"``."""

Authorize: TypeAlias = Callable[[Request, str], bool | Awaitable[bool]]
"""``authorize(request, action)``, plain or async: may this request ``"view"`` or do one
of :data:`ACTIONS`? A false answer refuses the request."""

NO_HOSTS_BANNER = (
    "Read-only: this console was given no allowed hosts (create_app(allowed_hosts=...)), "
    "so it cannot tell its own page from a DNS-rebinding site's and refuses every action."
)
CSRF_COOKIE = "jobrun_console_csrf"
CSRF_FIELD = "csrf_token"


class Refused(Exception):
    """A request the console will not serve; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Guard:
    """CSRF tokens, the Origin check and the host's ``authorize``, for one console."""

    def __init__(
        self,
        *,
        read_only: bool,
        authorize: Authorize | None,
        allowed_hosts: AllowedHosts | None,
        trusted_origins: Iterable[str] = (),
        secret: bytes | None = None,
    ) -> None:
        # Without allowed hosts, a DNS-rebinding site's requests look same-origin:
        # such a console only shows, and says why on every page.
        self.banner = None if allowed_hosts is not None or read_only else NO_HOSTS_BANNER
        self.read_only = read_only or allowed_hosts is None
        self._allowed_hosts = allowed_hosts
        self._authorize = authorize
        self._secret = secret or secrets.token_bytes(32)
        self._trusted = {urlsplit(origin).netloc.lower() for origin in trusted_origins}

    # -- who --------------------------------------------------------------------------

    async def allows(self, request: Request, action: str) -> bool:
        if self.read_only and action != VIEW:
            return False
        if self._authorize is None:
            return True
        verdict = self._authorize(request, action)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    async def abilities(self, request: Request) -> dict[str, bool]:
        return {action: await self.allows(request, action) for action in ACTIONS}

    async def require_view(self, request: Request) -> None:
        if not await self.allows(request, VIEW):
            raise Refused(403, "you may not view this console")

    # -- CSRF -------------------------------------------------------------------------

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode("utf-8"), hashlib.sha256).hexdigest()

    def token_for(self, request: Request) -> str:
        """The form token for this browser, minting its cookie nonce if it has none."""
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or len(nonce) > 100:
            nonce = getattr(request.state, "csrf_nonce", None) or secrets.token_urlsafe(24)
            request.state.csrf_nonce = nonce
        return self._sign(nonce)

    def set_cookie(self, request: Request, response: Response) -> None:
        nonce = getattr(request.state, "csrf_nonce", None)
        if nonce is None:
            return
        response.set_cookie(
            CSRF_COOKIE,
            nonce,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    # -- a state change ---------------------------------------------------------------

    def _same_origin(self, request: Request) -> bool:
        claimed = request.headers.get("origin") or request.headers.get("referer")
        if not claimed or claimed == "null":
            return False
        try:
            netloc = urlsplit(claimed).netloc.lower()
        except ValueError:  # a malformed IPv6 literal
            return False
        if netloc in self._trusted:
            return True
        host = request.headers.get("host", "").lower()
        allowed = self._allowed_hosts is not None and self._allowed_hosts.allows(netloc)
        return bool(netloc) and netloc == host and allowed

    async def check_post(self, request: Request, form: dict[str, str], action: str) -> None:
        """Raise :class:`Refused` unless this POST may change state as ``action``."""
        if self.read_only:
            raise Refused(403, self.banner or "this console is read-only")
        if not self._same_origin(request):
            raise Refused(403, "refused: the request did not come from this console's page")
        nonce = request.cookies.get(CSRF_COOKIE, "")
        token = form.get(CSRF_FIELD, "")
        if not nonce or not hmac.compare_digest(token, self._sign(nonce)):
            raise Refused(403, "refused: the form's CSRF token is missing or wrong; reload")
        if not await self.allows(request, action):
            raise Refused(403, f"you may not {action} runs here")
