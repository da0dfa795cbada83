"""Event store: an append-only PostgreSQL log of domain events with a gap-free global order.

Public interface (see each docstring for guarantees):

- ``EventStore(dsn, registry=..., options=StoreOptions(...))``; ``install()`` creates schema
  ``lakefold``. ``append(stream_id, events, expected_version=...)`` and
  ``append_streams([StreamEvents(...), ...])`` (atomic over streams, idempotent by event id);
  ``read_stream``, ``read_category``, ``read_all(from_position, limit)``, ``head()``;
  ``subscribe(name)`` (durable) and ``tail()`` (ephemeral); ``delete_stream(..., hard=...)``;
  ``transaction()`` for appends and checkpoints together with your own writes; ``status()``.
- Conventions: stream versions are 1-based; global positions are 1-based and dense, ``head()``
  is the last visible one (0 when empty), ``from_position`` is inclusive and ranges are
  ``[start, end)``. Positions are assigned once an event is final (after its transaction and
  every older running one have ended), so ``append`` returns ``position=None`` for fresh
  events (``wait_for_positions`` fills them in); a hard-deleted event leaves a hole.
- Checkpoints: ``Subscription.save_checkpoint()``, ``UnitOfWork.save_checkpoint()`` or
  ``save_checkpoint(conn, name, position)`` on your own psycopg connection, so the checkpoint
  commits with your writes (exactly-once effect over at-least-once delivery).
- Bulk reads by position range live in the public module ``lakefold.eventstore.arrow`` (not
  in this package's names since the public faces were curated; import them from there):
  ``read_events_range(dsn, start, end, category=..., types=..., columns=...)`` yields Arrow
  record batches (``EVENTS_ARROW_SCHEMA``, or ``events_schema(columns)``) for Spark workers and
  rebuilds; ``head_position(dsn)`` gives the range's end. Complete ranges of the log are sealed
  into compressed columnar segments in the background (``EventStore.seal()`` on request;
  ``StoreOptions.seal_segments``), which bulk reads read instead of rows; with
  ``shredded=True`` their payloads' scalar fields come parsed too (column
  ``PAYLOAD_FIELDS``). Bulk consumers that move rows themselves (``COPY ... TO STDOUT``) take
  the log read as one literal SELECT from ``events_range_select(conn, start, end, ...)``.
- ``list_categories(dsn)``, ``list_event_types(dsn, category)`` and ``list_streams(dsn,
  category)``: what the store holds, for checking names before reading;
  ``list_subscriptions(dsn)``: the durable subscriptions' checkpoints.
- Ports: ``EventRecorder`` with ``PostgresRecorder`` and ``InMemoryRecorder``.
- The domain side: ``Aggregate`` with ``@when(Event)`` handlers, ``Repository(store, Class,
  snapshot_every=N)`` with ``get``, ``save`` (optimistic, several aggregates atomically),
  ``update`` and ``retry`` (commands again on a conflict); snapshots in
  ``PostgresSnapshots`` / ``InMemorySnapshots``.
"""

from lakefold.eventstore._aggregates import Aggregate, AggregateError, when
from lakefold.eventstore._inventory import (
    StreamInfo,
    SubscriptionInfo,
    list_categories,
    list_event_types,
    list_streams,
    list_subscriptions,
)
from lakefold.eventstore._memory import InMemoryRecorder
from lakefold.eventstore._model import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    AppendedEvent,
    AppendResult,
    EventStoreStatus,
    Expected,
    ExpectedVersion,
    StreamState,
)
from lakefold.eventstore._postgres import PostgresRecorder, save_checkpoint
from lakefold.eventstore._recorder import EventRecorder
from lakefold.eventstore._repository import (
    AggregateNotFoundError,
    InMemorySnapshots,
    PostgresSnapshots,
    Repository,
    Snapshot,
)
from lakefold.eventstore._store import EventStore, StoreOptions, StreamEvents, UnitOfWork
from lakefold.eventstore._subscriptions import EventBatch, Subscription, SubscriptionOptions
from lakefold.eventstore.exceptions import (
    EventStoreError,
    EventStoreNotInstalledError,
    EventStoreUnavailableError,
    IdempotencyConflictError,
    InvalidRequestError,
    StreamDeletedError,
    WatermarkHeldError,
    WrongExpectedVersionError,
)

__all__: list[str] = [
    "ANY",
    "NO_STREAM",
    "STREAM_EXISTS",
    "Aggregate",
    "AggregateError",
    "AggregateNotFoundError",
    "AppendResult",
    "AppendedEvent",
    "EventBatch",
    "EventRecorder",
    "EventStore",
    "EventStoreError",
    "EventStoreNotInstalledError",
    "EventStoreStatus",
    "EventStoreUnavailableError",
    "Expected",
    "ExpectedVersion",
    "IdempotencyConflictError",
    "InMemoryRecorder",
    "InMemorySnapshots",
    "InvalidRequestError",
    "PostgresRecorder",
    "PostgresSnapshots",
    "Repository",
    "Snapshot",
    "StoreOptions",
    "StreamDeletedError",
    "StreamEvents",
    "StreamInfo",
    "StreamState",
    "Subscription",
    "SubscriptionInfo",
    "SubscriptionOptions",
    "UnitOfWork",
    "WatermarkHeldError",
    "WrongExpectedVersionError",
    "list_categories",
    "list_event_types",
    "list_streams",
    "list_subscriptions",
    "save_checkpoint",
    "when",
]
