"""Errors of the changelog store, and the base of every capture error.

The store is the lowest room of ``lakefold.capture``, so the capture's base error lives here with
the errors the store raises; ``lakefold.capture.exceptions`` adds the errors of replication,
decoding and configuration. Every error says what happened and what to do. Transient errors (a
dropped connection, a server restart) are retried by ``Capture.run`` with backoff; terminal ones
stop it.
"""

from __future__ import annotations

from datetime import datetime

from lakefold.core.exceptions import TerminalError, TransientError


class CaptureError(TerminalError):
    """Capture cannot continue without a person changing something."""


class OwnershipError(CaptureError):
    """A publication, slot or stream exists but belongs to something other than this capture."""


class OwnershipLostError(CaptureError):
    """This capture no longer owns its slot: another capture took it over. It stops and does
    not take the slot back by itself."""


class StoreError(CaptureError):
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


class ConnectionLostError(TransientError):
    """A connection to the source or the store dropped; the capture reconnects and resumes."""


class StoreUnavailableError(ConnectionLostError):
    """The changelog store cannot be reached right now."""
