"""Errors of the capture layer: replication, decoding, configuration and the changelog store.

Every error says what happened and what to do. Transient errors (a dropped connection, a
server restart) are retried by ``Capture.run`` with backoff; terminal ones stop it. The base
``CaptureError`` and the errors the changelog store raises are defined in
``lakefold.store.exceptions`` (the store is the lowest room of capture and imports nothing
above it); this module lists every capture error.
"""

from __future__ import annotations

from lakefold.core.exceptions import ConfigurationError
from lakefold.store.exceptions import (
    CaptureConfigurationError,
    CaptureError,
    CaptureLookupError,
    CaptureTerminalError,
    CaptureValueError,
    ConnectionLostError,
    OwnershipError,
    OwnershipLostError,
    ReaderBehindCompactionError,
    StoreError,
    StoreUnavailableError,
    UnknownStreamError,
)

__all__ = [
    "CaptureConfigurationError",
    "CaptureError",
    "CaptureLookupError",
    "CaptureRunningError",
    "CaptureTerminalError",
    "CaptureValueError",
    "ConnectionLostError",
    "DecodingError",
    "OwnershipError",
    "OwnershipLostError",
    "ReaderBehindCompactionError",
    "SlotError",
    "SourceConfigurationError",
    "StoreError",
    "StoreUnavailableError",
    "UnknownStreamError",
]


class SourceConfigurationError(CaptureTerminalError, ConfigurationError):
    """The source server or database is not set up for logical replication as required
    (``wal_level``, privileges, replica identity)."""


class CaptureRunningError(OwnershipError):
    """Another live capture owns the slot in this store (``CaptureConfig.take_over`` asks it
    to hand the slot over)."""


class SlotError(CaptureTerminalError):
    """The replication slot is missing, in use by another process, or unusable."""


class DecodingError(CaptureTerminalError):
    """The replication stream contained something the decoder cannot interpret."""
