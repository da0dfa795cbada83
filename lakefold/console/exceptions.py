"""The console's errors: a request for something that does not exist (HTTP 404), one the
console cannot do as asked (409), and a refused start (a non-loopback address without a
token). The store being down is the stores' own transient errors (HTTP 503)."""

from __future__ import annotations

from lakefold.core.exceptions import ConfigurationError, TerminalError


class ConsoleError(TerminalError):
    """A console request or start that cannot succeed as it is."""


class ConsoleNotFoundError(ConsoleError):
    """No such projection, stream, category, dead letter or capture (HTTP 404)."""


class ConsoleRequestError(ConsoleError):
    """The console cannot do what was asked, as it is configured (HTTP 409)."""


class ConsoleBindError(ConsoleError, ConfigurationError):
    """The console would listen on a non-loopback address without a token."""
