"""Logins: server-side sessions, and a limit on wrong tokens.

After ``POST /login`` with the right token, the page's cookie holds a session id: 32 random
bytes, not the token, known only to this console process (so a restart logs every page out),
expiring after ``Sessions.lifetime_s`` and ended by ``POST /logout``. The console keeps only a
SHA-256 digest of each id.

Wrong tokens (at the login or as a bearer header) count against the client's address: after
``per_client`` of them within ``window_s`` the address gets 429 for the rest of the window,
even with the right token (a guesser learns nothing while it is locked out); all clients
together may make ``overall`` mistakes per window.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import deque

#: The session cookie's name.
COOKIE = "lakefold_console_session"


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    """The live sessions of one console; thread-safe."""

    def __init__(self, *, lifetime_s: float = 12 * 3600, most: int = 1000) -> None:
        self.lifetime_s = lifetime_s
        self.most = most
        self._expires: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def start(self) -> str:
        """A new session's id (for the cookie)."""
        session_id = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._forget_expired(now)
            while len(self._expires) >= self.most:  # the oldest go first
                self._expires.pop(min(self._expires, key=self._expires.__getitem__))
            self._expires[_digest(session_id)] = now + self.lifetime_s
        return session_id

    def valid(self, session_id: str | None) -> bool:
        """Whether ``session_id`` is a live session of this console."""
        if not session_id:
            return False
        with self._lock:
            expires = self._expires.get(_digest(session_id))
            return expires is not None and expires > time.monotonic()

    def end(self, session_id: str | None) -> None:
        """End a session (logout); an unknown id is ignored."""
        if session_id:
            with self._lock:
                self._expires.pop(_digest(session_id), None)

    def _forget_expired(self, now: float) -> None:
        for key in [k for k, at in self._expires.items() if at <= now]:
            del self._expires[key]


class TokenGuesses:
    """Wrong tokens per client address and overall, in a sliding window; thread-safe."""

    def __init__(self, *, per_client: int = 5, overall: int = 30,
                 window_s: float = 60.0) -> None:
        self.per_client = per_client
        self.overall = overall
        self.window_s = window_s
        self._by_client: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again; None when it may now."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            waits = []
            mine = self._by_client.get(client)
            if mine is not None and len(mine) >= self.per_client:
                waits.append(mine[0] + self.window_s - now)
            if len(self._all) >= self.overall:
                waits.append(self._all[0] + self.window_s - now)
        return max(waits) if waits else None

    def wrong(self, client: str) -> None:
        """Count a wrong token from ``client``."""
        now = time.monotonic()
        with self._lock:
            self._by_client.setdefault(client, deque()).append(now)
            self._all.append(now)

    def _expire(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._all and self._all[0] <= cutoff:
            self._all.popleft()
        for client in list(self._by_client):
            times = self._by_client[client]
            while times and times[0] <= cutoff:
                times.popleft()
            if not times:
                del self._by_client[client]
