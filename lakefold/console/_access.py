"""Who may use the console: the listening address and the token.

The console listens on 127.0.0.1 unless told otherwise; any other address needs a token
(``--token`` or ``LAKEFOLD_CONSOLE_TOKEN``), and is refused without one. With a token, every
request carries it: as ``Authorization: Bearer <token>`` (API clients, Prometheus), or as the
``HttpOnly`` cookie that ``POST /login`` sets after checking it (the page). A request without
it gets 401 (the page: a form that asks for it). The token is compared in constant time and
never written to a page or a log.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from http.cookies import CookieError, SimpleCookie
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from lakefold.console.exceptions import ConsoleBindError

COOKIE = "lakefold_console_token"
#: Paths served without the token: the login form's own request.
OPEN_PATHS = frozenset({"/login"})
_LOGIN_PAGE = Path(__file__).with_name("static") / "login.html"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token (ConsoleBindError, with the fix)."""
    if not token and not is_loopback(host):
        raise ConsoleBindError(
            f"refusing to listen on {host} without a token: anyone who reaches it could pause "
            "projections and read data; pass --token (or set LAKEFOLD_CONSOLE_TOKEN), or "
            "listen on 127.0.0.1")


def presented_token(scope: Scope) -> str | None:
    """The token a request carries: its bearer header, else its cookie."""
    headers: dict[bytes, bytes] = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    cookie = headers.get(b"cookie")
    if cookie:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(cookie.decode("latin-1"))
        except CookieError:  # a malformed cookie header carries no token
            return None
        if COOKIE in jar:
            return str(jar[COOKIE].value)
    return None


def token_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class RequireToken:
    """ASGI middleware: 401 for any request without the token (the page's path gets the
    login form with it), except ``OPEN_PATHS``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS \
                or token_matches(self.token, presented_token(scope)):
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/":
            body = _LOGIN_PAGE.read_bytes()
            kind = b"text/html; charset=utf-8"
        else:
            body = json.dumps({
                "error": "this console needs its token: send 'Authorization: Bearer <token>' "
                         "(or log in on the page)", "code": "unauthorized"}).encode()
            kind = b"application/json"
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", kind), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
