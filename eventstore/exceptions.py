"""Errors of the event store. Each says what happened and what to do; each is transient (retry)
or terminal (fix something first)."""

from __future__ import annotations

from lakefold.core.exceptions import LakefoldError, TerminalError, TransientError


class EventStoreError(LakefoldError):
    """Base of every event store error, transient and terminal: ``except EventStoreError``
    catches them all; ``error.transient`` tells which to retry."""


class EventStoreTerminalError(EventStoreError, TerminalError):
    """The event store refused an operation in a way that retrying will not fix."""


class InvalidRequestError(EventStoreTerminalError, ValueError):
    """An append, read or delete was given bad input; nothing was written."""


class WrongExpectedVersionError(EventStoreTerminalError):
    """The stream's version was not the one the append expected; nothing was written.

    ``actual_version`` is the stream's version when the append was checked (``None``: the stream
    does not exist). Reload the stream and decide again, or append with ``ANY``.
    """

    def __init__(self, stream_id: str, *, expected: str, actual_version: int | None) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual_version = actual_version
        actual = "does not exist" if actual_version is None else f"is at version {actual_version}"
        super().__init__(
            f"stream {stream_id!r} {actual}, but the append expected {expected}; nothing was "
            "written: reload the stream and retry, or append with expected_version=ANY"
        )


class StreamDeletedError(EventStoreTerminalError):
    """The stream was deleted (``mode`` 'soft' or 'hard'); it cannot be appended to or deleted
    again in that mode."""

    def __init__(self, stream_id: str, *, mode: str) -> None:
        self.stream_id = stream_id
        self.mode = mode
        super().__init__(
            f"stream {stream_id!r} was {mode}-deleted; nothing was written: use a new stream id"
            + (" (a soft-deleted stream can still be hard-deleted for erasure)"
               if mode == "soft" else "")
        )


class IdempotencyConflictError(EventStoreTerminalError):
    """An event id is already stored as a different event (another stream, type, schema
    version, data or metadata), or only some events of a retried append are stored; nothing
    was written."""

    @classmethod
    def differing(cls, event_id: object, *, stored: tuple[str, int, str, int],
                  retried: tuple[str, str, int], data: bool,
                  metadata: bool) -> IdempotencyConflictError:
        """The conflict of a retried event that differs from the stored one. ``stored`` is the
        stored event's (stream, stream version, type, schema version), ``retried`` the retry's
        (stream, type, schema version); ``data`` and ``metadata`` say whether those differ.
        The message names exactly the fields that differ, with both values where short."""
        stream, version, type_, schema_version = stored
        differences = [
            f"{what} ({old!r} stored, {new!r} in this append)"
            for what, old, new in (("stream", stream, retried[0]), ("type", type_, retried[1]),
                                   ("schema version", schema_version, retried[2]))
            if old != new
        ]
        differences += [what for what, differs in (("data", data), ("metadata", metadata))
                        if differs]
        stored_at = f"{stream} v{version}"
        return cls(
            f"event id {event_id} is already stored ({stored_at}) as a different event: "
            f"{'; '.join(f'different {d}' for d in differences)}; use a new event id for a "
            "different event, or resend the original unchanged (nothing was written)"
        )


class EventStoreNotInstalledError(EventStoreTerminalError):
    """Schema ``lakefold`` has no event store tables in this database."""


class EventStoreUnavailableError(EventStoreError, TransientError):
    """The PostgreSQL server could not be reached or dropped the connection; retry later."""


class WatermarkHeldError(EventStoreError, TransientError):
    """Committed events are not yet visible to global readers because an older transaction is
    still running (it holds the visibility watermark); they will be once it ends."""
