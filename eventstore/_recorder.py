"""The recorder port: what an event store backend must do. ``PostgresRecorder`` is the real one,
``InMemoryRecorder`` the reference for tests and prototypes; both pass the same contract tests
(``tests/eventstore/recorder_contract.py``).

Every implementation guarantees:

- ``append`` is atomic over all its streams: either every event is stored, or none is (and the
  error says why). A retry whose event ids are all stored with the same payload returns the
  original result with ``duplicate=True`` and writes nothing.
- Stream versions are 1-based and dense per stream; global positions are 1-based, assigned in
  an order that never changes, and never reused. A reader that has seen position ``p`` will
  never later find a new event below ``p``.
- ``read_log`` returns fewer than ``limit`` events only when it reached ``to_position`` or the
  head (it skips over hidden and erased events by itself).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from lakefold.eventstore._model import (
    AppendedEvent,
    AppendResult,
    EventStoreStatus,
    ExpectedVersion,
    LogQuery,
    Sealed,
    Sequenced,
    StreamAppend,
    StreamQuery,
    StreamState,
)
from lakefold.schemas.events import EventEnvelope


class Waiter(ABC):
    """A wake-up source for subscriptions: new positions may be readable."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when woken by new events (a hint only:
        callers must still read to find out)."""

    @abstractmethod
    def close(self) -> None:
        """Release the wake-up source."""


class EventRecorder(ABC):
    """Stores and reads events; see the module docstring for the guarantees."""

    #: Appends of at least this many events may come with their events in ``StreamedEvents``
    #: (validated while consumed; see ``build_appends``); None: every event arrives validated.
    #: A recorder that sets it must consume every event of an append before committing it.
    streams_appends_from: int | None = None

    @abstractmethod
    def install(self) -> None:
        """Create what the recorder needs (idempotent)."""

    @abstractmethod
    def append(self, appends: Sequence[StreamAppend]) -> AppendResult:
        """Append to one or more streams atomically, checking each expected version."""

    @abstractmethod
    def read_stream(self, stream_id: str, query: StreamQuery) -> list[EventEnvelope]:
        """Events of one stream in version order (or reverse order)."""

    @abstractmethod
    def read_log(self, query: LogQuery) -> list[EventEnvelope]:
        """Events of the global log in position order, from ``query.from_position``
        (inclusive)."""

    @abstractmethod
    def sequence(self) -> Sequenced:
        """Make every event that can be final visible to global readers; return the head."""

    def head(self) -> int:
        """The last global position visible to readers (0 for an empty store)."""
        return self.sequence().head

    @abstractmethod
    def stream_state(self, stream_id: str) -> StreamState:
        """A stream's version and deletion state."""

    @abstractmethod
    def delete_stream(self, stream_id: str, *, expected_version: ExpectedVersion, hard: bool,
                      event_id: uuid.UUID) -> AppendedEvent:
        """Delete a stream (soft: hide its events; hard: erase them) and append the deletion
        record (type ``$stream.deleted``, id ``event_id``) to it."""

    @abstractmethod
    def positions_of(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        """The global positions of stored events (None: not yet visible to global readers);
        ids that are not stored are absent."""

    @abstractmethod
    def load_checkpoint(self, name: str) -> int | None:
        """The last position saved for subscription ``name``, or None."""

    @abstractmethod
    def save_checkpoint(self, name: str, position: int) -> None:
        """Save the last processed position of subscription ``name``."""

    @abstractmethod
    def open_waiter(self) -> Waiter:
        """A wake-up source for a subscription."""

    @abstractmethod
    def status(self, threshold_s: float) -> EventStoreStatus:
        """Head, pending events and the transaction holding the watermark, if any."""

    def seal(self, *, progress: Callable[[int, int], None] | None = None) -> Sealed:
        """Store complete ranges of the log in read-optimized form (see ``_segments.py``), if
        the recorder has one; the default has none."""
        return Sealed(head=self.head())

    def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Release connections and threads."""
