"""The one error hierarchy: every lakefold error is a LakefoldError, either transient or terminal.

Retry only transient errors (with backoff); surface terminal ones. Each package derives its own
errors from these in its own ``exceptions`` module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The marker every lakefold error carries as a note (PEP 678): tracebacks print it after the
# error's message, so it survives where Spark hands an error back as text (a failed Python
# worker, a foreachBatch function), and ``marker_in`` reads it back from that text.
_MARKER = re.compile(r"\[lakefold-error code=(?P<code>\w+) transient=(?P<transient>true|false)\]")
_TRACEBACK = "Traceback (most recent call last):"


class LakefoldError(Exception):
    """Base of every error lakefold raises. The message says what happened and what to do.

    Each carries a stable marker note, ``[lakefold-error code=NAME transient=true|false]``,
    which is how an error that comes back from Spark as text is classified (``marker_in``).
    """

    transient: bool = False

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.add_note(error_marker(self))

    @property
    def code(self) -> str:
        """The stable code of this error: its class name."""
        return type(self).__name__


@dataclass(frozen=True)
class ErrorMarker:
    """What a marker says of an error that came back as text: its code and whether it is
    transient."""

    code: str
    transient: bool


def error_marker(error: LakefoldError) -> str:
    """The marker text of ``error``: ``[lakefold-error code=NAME transient=true|false]``."""
    return f"[lakefold-error code={error.code} transient={str(error.transient).lower()}]"


def marker_in(text: str) -> ErrorMarker | None:
    """The marker of the error a traceback text ends with (the last exception of the chain,
    before any JVM stack trace); ``None`` when that error is not a lakefold error."""
    text = text.split("JVM stacktrace:")[0]
    last = text.rfind(_TRACEBACK)
    found = list(_MARKER.finditer(text[last:] if last >= 0 else text))
    if not found:
        return None
    return ErrorMarker(found[-1]["code"], found[-1]["transient"] == "true")


class TransientError(LakefoldError):
    """A failure that may go away by itself (a dropped connection, a commit conflict): retry it."""

    transient = True


class TerminalError(LakefoldError):
    """A failure that needs a person (bad input, bad configuration): retrying will not help."""

    transient = False


class ConfigurationError(TerminalError):
    """A setting is wrong or a service cannot be reached as configured."""


class InvalidValueError(TerminalError, ValueError):
    """A value given in the wrong form (an LSN that is not ``X/Y``, say)."""


class LocalServiceError(TerminalError):
    """A throwaway local service (PostgreSQL, Redis) could not be started or stopped."""


class EncodingError(TerminalError, TypeError):
    """A value has no encoding in the output asked for (JSON, say); also a ``TypeError``, which
    is what ``json.dumps``' ``default`` hook is expected to raise."""
