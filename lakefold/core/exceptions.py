"""The one error hierarchy: every lakefold error is a LakefoldError, either transient or terminal.

Retry only transient errors (with backoff); surface terminal ones. Each package derives its own
errors from these in its own ``exceptions`` module.
"""

from __future__ import annotations


class LakefoldError(Exception):
    """Base of every error lakefold raises. The message says what happened and what to do."""

    transient: bool = False


class TransientError(LakefoldError):
    """A failure that may go away by itself (a dropped connection, a commit conflict): retry it."""

    transient = True


class TerminalError(LakefoldError):
    """A failure that needs a person (bad input, bad configuration): retrying will not help."""

    transient = False


class ConfigurationError(TerminalError):
    """A setting is wrong or a service cannot be reached as configured."""


class LocalServiceError(TerminalError):
    """A throwaway local service (PostgreSQL, Redis) could not be started or stopped."""
