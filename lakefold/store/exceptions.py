"""Errors of the changelog store, and the base of every capture error.

The store sits below the capture (it was capture's lowest room until round three), so the
capture's base error lives here with the errors the store raises;
``lakefold.capture.exceptions`` adds the errors of replication, decoding and configuration.
Every error says what happened and what to do. Transient errors (a dropped connection, a server
restart) are retried by ``Capture.run`` with backoff; terminal ones stop it.
"""

from __future__ import annotations

from datetime import datetime

from lakefold.core.exceptions import (
    ConfigurationError,
    LakefoldError,
    TerminalError,
    TransientError,
)


class CaptureError(LakefoldError):
    """Base of every capture error, transient and terminal: ``except CaptureError`` catches
    them all; ``error.transient`` (or ``except TransientError``) tells which to retry."""


class CaptureTerminalError(CaptureError, TerminalError):
    """Capture cannot continue without a person changing something."""


class CaptureValueError(CaptureTerminalError, ValueError):
    """A value given to or read by capture is malformed (an LSN, an option, a literal); it is
    also a ``ValueError`` for callers that catch that."""


class CaptureLookupError(CaptureTerminalError, LookupError):
    """Something capture looked up is gone (e.g. a segment compacted meanwhile); it is also a
    ``LookupError`` for callers that catch that."""


class CaptureConfigurationError(CaptureTerminalError, ConfigurationError):
    """A capture or store option has a wrong value."""


class OwnershipError(CaptureTerminalError):
    """A publication, slot or stream exists but belongs to something other than this capture."""


class OwnershipLostError(CaptureTerminalError):
    """This capture no longer owns its slot: another capture took it over. It stops and does
    not take the slot back by itself."""


class StoreError(CaptureTerminalError):
    """The changelog store rejected an operation or is not installed."""


class UnknownStreamError(StoreError):
    """A stream name that the store does not hold."""


class ReaderBehindCompactionError(StoreError):
    """A durable reader would continue after a position below records that compaction has
    already removed (``_reader_registry``): reading on would silently miss them. The attributes
    say which stream, where the reader stands and up to where compaction removed what it needs."""

    def __init__(self, message: str, *, reader: str, stream: str, position: int,
                 removed_to: int, last_run: datetime | None, history: bool) -> None:
        super().__init__(message)
        self.reader = reader
        self.stream = stream
        self.position = position
        self.removed_to = removed_to
        self.last_run = last_run
        self.history = history


class ConnectionLostError(CaptureError, TransientError):
    """A connection to the source or the store dropped; the capture reconnects and resumes."""


class StoreUnavailableError(ConnectionLostError):
    """The changelog store cannot be reached right now."""
