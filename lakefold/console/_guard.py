"""The console's gate: what every request passes before any route, as ASGI middleware.

Assume a hostile page in the operator's browser. In this order, a request is refused when:

1. its path or query holds a NUL byte (400: no name holds one; the store would refuse it);
2. its ``Host`` is not one of the console's names (400; ``_access.allowed_hosts``): a page on a
   name the attacker controls that resolves to 127.0.0.1 (DNS rebinding) reads nothing;
3. it would change something (any method but GET and HEAD) and
   - its ``Origin`` (else its ``Referer``) is another origin than the console's own, port
     included (403): ``SameSite`` cookies treat every port of 127.0.0.1 as the same site, the
     origin does not; or
   - it lacks the header ``X-Lakefold-Request`` (403): neither a form nor a ``no-cors``
     fetch can send a custom header, and a cross-origin fetch that sends one needs a CORS
     pre-flight the console never grants;
4. a token is set, and it carries neither a live session cookie nor ``Authorization: Bearer
   <token>`` (401; ``/`` answers with the login form), or its address made too many wrong
   guesses (429, ``_sessions.TokenGuesses``).

``POST /login`` (with the token as JSON ``{"token": ...}``) starts a session and sets its
cookie (``HttpOnly``, ``SameSite=Strict``); ``POST /logout`` ends it. Every answer carries
headers that keep the page out of frames (``X-Frame-Options: DENY``, CSP ``frame-ancestors
'none'``), its scripts to its own files, and its answers out of caches.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakefold.console._access import host_allowed, split_host
from lakefold.console._sessions import COOKIE, Sessions, TokenGuesses

#: The header every request that changes something must carry (any value).
ACTION_HEADER = "X-Lakefold-Request"
_ACTION_HEADER = ACTION_HEADER.lower().encode()
_SAFE_METHODS = frozenset({"GET", "HEAD"})
#: Paths served without the token: the login form's script and its requests.
OPEN_PATHS = frozenset({"/login", "/logout", "/static/login.js"})
_LOGIN_PAGE = Path(__file__).with_name("static") / "login.html"
_MAX_LOGIN_BODY = 4096

SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
     b"img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
     b"form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


@dataclass(frozen=True)
class Refusal:
    """Why a request is not let through: its answer's status, error text and code."""

    status: int
    error: str
    code: str
    retry_after_s: float | None = None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers") or []}


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def same_origin(origin: str, scheme: str, host_header: str) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) is the console's own origin: the
    request's scheme, and the host and port its ``Host`` names."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != scheme or not parts.hostname:
        return False
    name, host_port = split_host(host_header)
    default = _default_port(parts.scheme)
    return (parts.hostname.lower().rstrip("."), port or default) == (name, host_port or default)


def session_of(headers: dict[bytes, bytes]) -> str | None:
    """The session id a request's cookie carries."""
    cookie = headers.get(b"cookie")
    if not cookie:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie.decode("latin-1"))
    except CookieError:  # a malformed cookie header carries no session
        return None
    return str(jar[COOKIE].value) if COOKIE in jar else None


def bearer_of(headers: dict[bytes, bytes]) -> bytes | None:
    """The raw bytes of a request's bearer token (a UTF-8 token arrives as its bytes)."""
    auth = headers.get(b"authorization", b"")
    if auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    return None


class Guard:
    """ASGI middleware: the checks of the module docstring, then the application; the
    security headers on every answer."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: frozenset[str],
                 token: str | None = None, sessions: Sessions | None = None,
                 guesses: TokenGuesses | None = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.token = token.encode("utf-8") if token else None
        self.sessions = sessions or Sessions()
        self.guesses = guesses or TokenGuesses()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                if b"cache-control" not in names and not scope["path"].startswith("/static/"):
                    extra.append((b"cache-control", b"no-store"))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await _answer(send_secured, refusal)
            return
        path = scope["path"]
        if path == "/login" and scope["method"] == "POST":
            await self._login(scope, receive, send_secured)
            return
        if path == "/logout" and scope["method"] == "POST":
            await self._logout(scope, send_secured)
            return
        if self.token is not None and path not in OPEN_PATHS:
            denied = self._unauthorized(scope)
            if denied is not None:
                await _answer(send_secured, denied)
                return
        await self.app(scope, receive, send_secured)

    def _refusal(self, scope: Scope) -> Refusal | None:
        """Why the request is refused before anything else; None when it passes checks
        1-3."""
        query = scope.get("query_string", b"")
        if "\x00" in scope["path"] or b"%00" in query or b"\x00" in query:
            return Refusal(400, "a name or parameter holds a NUL byte; no name in lakefold "
                                "holds one", "bad_request")
        headers = _headers(scope)
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.allowed_hosts):
            return Refusal(400, "this console does not answer to that host name; open it by "
                                "its own address (or start it with --allow-host NAME)",
                           "bad_host")
        if scope["method"] in _SAFE_METHODS:
            return None
        origin = headers.get(b"origin")
        if origin is None and b"referer" in headers:
            referer = urlsplit(headers[b"referer"].decode("latin-1"))
            origin = f"{referer.scheme}://{referer.netloc}".encode("latin-1")
        if origin is not None and not same_origin(origin.decode("latin-1"),
                                                  scope.get("scheme", "http"), host):
            return Refusal(403, "refused: this request comes from a page of another origin; "
                                "act from the console's own page", "cross_origin")
        if not headers.get(_ACTION_HEADER, b"").strip():
            return Refusal(403, f"a request that changes something needs the header "
                                f"{ACTION_HEADER} (any value; the console's page sends it)",
                           "missing_header")
        return None

    def _client(self, scope: Scope) -> str:
        client = scope.get("client")
        return str(client[0]) if client else "unknown"

    def _unauthorized(self, scope: Scope) -> Refusal | None:
        assert self.token is not None  # noqa: S101 - only called with a token
        headers = _headers(scope)
        bearer = bearer_of(headers)
        if bearer is None and self.sessions.valid(session_of(headers)):
            return None
        if bearer is not None:
            client = self._client(scope)
            wait = self.guesses.retry_after(client)
            if wait is not None:
                return Refusal(429, f"too many wrong tokens; try again in {wait:.0f} s",
                               "rate_limited", wait)
            if hmac.compare_digest(self.token, bearer):
                return None
            self.guesses.wrong(client)
        if scope["path"] == "/":
            return Refusal(401, "login", "login_page")
        return Refusal(401, "this console needs its token: send 'Authorization: Bearer "
                            "<token>' (or log in on the page)", "unauthorized")

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None:
            await _answer(send, Refusal(404, "this console has no token: there is nothing to "
                                             "log in to", "not_found"))
            return
        client = self._client(scope)
        wait = self.guesses.retry_after(client)
        if wait is not None:
            await _answer(send, Refusal(429, f"too many wrong tokens; try again in {wait:.0f} s",
                                        "rate_limited", wait))
            return
        body = await _read_body(receive, _MAX_LOGIN_BODY)
        given: object = None
        try:
            given = json.loads(body.decode("utf-8")).get("token") if body else None
        except (ValueError, AttributeError):
            pass
        if not isinstance(given, str):
            await _answer(send, Refusal(400, 'send the token as JSON: {"token": "..."}',
                                        "bad_request"))
            return
        if not hmac.compare_digest(self.token, given.encode("utf-8", "surrogateescape")):
            self.guesses.wrong(client)
            await _answer(send, Refusal(401, "wrong token", "unauthorized"))
            return
        cookie = (f"{COOKIE}={self.sessions.start()}; HttpOnly; SameSite=Strict; Path=/; "
                  f"Max-Age={int(self.sessions.lifetime_s)}"
                  + ("; Secure" if scope.get("scheme") == "https" else ""))
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(b"set-cookie", cookie.encode())]})
        await send({"type": "http.response.body", "body": b""})

    async def _logout(self, scope: Scope, send: Send) -> None:
        self.sessions.end(session_of(_headers(scope)))
        cookie = f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(b"set-cookie", cookie.encode())]})
        await send({"type": "http.response.body", "body": b""})


async def _read_body(receive: Receive, limit: int) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if len(body) > limit:
            return b""
        if not message.get("more_body"):
            return body


async def _answer(send: Send, refusal: Refusal) -> None:
    """A refusal as JSON ``{"error", "code"}``; the login form for ``login_page``."""
    if refusal.code == "login_page":
        body = _LOGIN_PAGE.read_bytes()
        kind = b"text/html; charset=utf-8"
    else:
        body = json.dumps({"error": refusal.error, "code": refusal.code}).encode()
        kind = b"application/json"
    extra = []
    if refusal.status == 401:
        extra.append((b"www-authenticate", b"Bearer"))
    if refusal.retry_after_s is not None:
        extra.append((b"retry-after", str(int(refusal.retry_after_s) + 1).encode()))
    await send({"type": "http.response.start", "status": refusal.status,
                "headers": [(b"content-type", kind),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
