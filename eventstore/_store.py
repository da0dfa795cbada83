"""``EventStore``: the public face of the event store. It turns domain events into validated
appends (through an ``EventRegistry``), decodes and upcasts what it reads, and hands out
subscriptions; storage is a recorder (``PostgresRecorder`` or ``InMemoryRecorder``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from pydantic import BaseModel

from lakefold.eventstore._commit_markers import install_commit_markers
from lakefold.eventstore._memory import InMemoryRecorder
from lakefold.eventstore._model import (
    ANY,
    AppendResult,
    EventStoreStatus,
    ExpectedVersion,
    LogQuery,
    Sealed,
    StreamAppend,
    StreamQuery,
    StreamState,
    build_appends,
    check_position,
    check_stream_id,
    check_types,
    finite_seconds,
    normalise_expected,
    positive_int,
)
from lakefold.eventstore._postgres import (
    PostgresRecorder,
    append_on,
    save_checkpoint as save_checkpoint_on,
)
from lakefold.eventstore._recorder import EventRecorder
from lakefold.eventstore._segments import SEGMENT_POSITIONS
from lakefold.eventstore._subscriptions import Subscription, SubscriptionOptions
from lakefold.eventstore.exceptions import (
    EventStoreTerminalError,
    InvalidRequestError,
    WatermarkHeldError,
)
from lakefold.schemas.events import (
    EMPTY_METADATA,
    EventEnvelope,
    EventMetadata,
    NewEvent,
    new_event_id,
)
from lakefold.schemas.exceptions import UnknownEventTypeError
from lakefold.schemas.registry import EventRegistry


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Tuning of a PostgreSQL-backed ``EventStore``.

    ``pool_size``: connections shared by the store's threads. ``watermark_threshold_s``: how
    long the watermark may be held before ``status()`` (and a log warning) names the holder.
    ``sequence_interval_s``: the minimum time between background sequencing rounds.
    ``seal_segments``: seal complete ranges of ``segment_positions`` positions in the
    background, for fast bulk reads (see ``_segments.py``); ``seal()`` seals on request either
    way."""

    pool_size: int = 10
    connect_timeout_s: float = 10.0
    watermark_threshold_s: float = 5.0
    sequence_interval_s: float = 0.02
    application_name: str = "lakefold-eventstore"
    seal_segments: bool = True
    segment_positions: int = SEGMENT_POSITIONS

    def __post_init__(self) -> None:
        positive_int(self.pool_size, "pool_size")
        finite_seconds(self.connect_timeout_s, "connect_timeout_s")
        finite_seconds(self.watermark_threshold_s, "watermark_threshold_s")
        finite_seconds(self.sequence_interval_s, "sequence_interval_s")
        positive_int(self.segment_positions, "segment_positions")


@dataclass(frozen=True, slots=True)
class StreamEvents:
    """One stream's part of a multi-stream append."""

    stream_id: str
    events: Sequence[NewEvent | BaseModel]
    expected_version: ExpectedVersion = ANY


class UnitOfWork:
    """Appends and checkpoints inside one PostgreSQL transaction, together with the caller's
    own writes on ``connection``. Everything commits when the ``EventStore.transaction()``
    block ends normally, and nothing does when it raises."""

    def __init__(self, store: EventStore, connection: psycopg.Connection[TupleRow]) -> None:
        self._store = store
        self.connection = connection
        self.appended = False

    def append(self, stream_id: str, events: Sequence[NewEvent | BaseModel], *,
               expected_version: ExpectedVersion = ANY,
               metadata: EventMetadata = EMPTY_METADATA) -> AppendResult:
        """Like ``EventStore.append``, inside this transaction."""
        return self.append_streams([StreamEvents(stream_id, events, expected_version)],
                                   metadata=metadata)

    def append_streams(self, streams: Sequence[StreamEvents], *,
                       metadata: EventMetadata = EMPTY_METADATA) -> AppendResult:
        """Like ``EventStore.append_streams``, inside this transaction."""
        appends = self._store._prepare(streams, metadata)
        result = append_on(self.connection, appends)
        self.appended = self.appended or not result.duplicate
        return result

    def save_checkpoint(self, name: str, position: int) -> None:
        """Save subscription ``name``'s checkpoint in this transaction."""
        save_checkpoint_on(self.connection, name, position)


class EventStore:
    """An append-only event store with optimistic concurrency, idempotent appends, a gap-free
    global order and subscriptions.

    Conventions: stream versions are 1-based (a stream's first event is version 1);
    global positions are 1-based and dense, ``head()`` is the last one visible to readers (0
    for an empty store), and ``from_position`` arguments are inclusive (0 and 1 both mean "from
    the start"). Stream ids are ``<category>-<id>``, e.g. ``order-42``.

    With a ``registry``, appends take registered pydantic models (or ``NewEvent``s that
    validate against them) and reads set ``EventEnvelope.event`` to the decoded, upcast model
    (``None`` for types the registry does not know). Without one, any JSON ``NewEvent`` goes.
    """

    def __init__(self, dsn: str, *, registry: EventRegistry | None = None,
                 options: StoreOptions | None = None) -> None:
        self.options = options or StoreOptions()
        if not isinstance(dsn, str) or not dsn.strip():
            raise InvalidRequestError("the event store needs a PostgreSQL DSN, e.g. "
                                 "'host=127.0.0.1 dbname=app user=app'")
        recorder = PostgresRecorder(
            dsn, pool_size=self.options.pool_size,
            connect_timeout_s=self.options.connect_timeout_s,
            sequence_interval_s=self.options.sequence_interval_s,
            watermark_threshold_s=self.options.watermark_threshold_s,
            application_name=self.options.application_name,
            segment_positions=self.options.segment_positions,
            seal_in_background=self.options.seal_segments,
        )
        self._init(recorder, registry)

    @classmethod
    def from_recorder(cls, recorder: EventRecorder, *, registry: EventRegistry | None = None,
                      options: StoreOptions | None = None) -> EventStore:
        """A store over any recorder (e.g. ``InMemoryRecorder()``)."""
        store = cls.__new__(cls)
        store.options = options or StoreOptions()
        store._init(recorder, registry)
        return store

    @classmethod
    def in_memory(cls, *, registry: EventRegistry | None = None) -> EventStore:
        """A store that keeps everything in this process (tests, prototypes)."""
        return cls.from_recorder(InMemoryRecorder(), registry=registry)

    def _init(self, recorder: EventRecorder, registry: EventRegistry | None) -> None:
        if registry is not None and not isinstance(registry, EventRegistry):
            raise InvalidRequestError(f"registry must be an EventRegistry, not {type(registry)}")
        self.recorder = recorder
        self.registry = registry

    def install(self) -> None:
        """Create schema ``lakefold``'s event store tables and functions (idempotent)."""
        self.recorder.install()

    def record_commit_order(self) -> None:
        """Make every later append write a commit marker, so that a capture of this database
        learns each append's commit LSN (views' ``lookup`` as of commit; see
        ``_commit_markers``). Idempotent; the first view with such a lookup does it too, but
        events appended before then have no commit LSN."""
        recorder = self.recorder
        if not isinstance(recorder, PostgresRecorder):
            raise EventStoreTerminalError("commit markers need the PostgreSQL event store")
        with recorder.connection() as conn:
            install_commit_markers(conn)

    def close(self) -> None:
        """Release connections and the background sequencer."""
        self.recorder.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- append -------------------------------------------------------------------------------

    def _to_new_event(self, event: object, metadata: EventMetadata) -> object:
        if isinstance(event, BaseModel):
            if self.registry is None:
                raise UnknownEventTypeError(
                    f"{type(event).__name__} is a pydantic model, but this store has no "
                    "registry; pass EventStore(..., registry=...) or append NewEvent values"
                )
            return self.registry.encode(event, metadata=metadata)
        if isinstance(event, NewEvent) and self.registry is not None:
            return self.registry.validate(event)
        return event  # validated (or refused) by build_appends

    def _prepare(self, streams: Sequence[StreamEvents], metadata: EventMetadata
                 ) -> tuple[StreamAppend, ...]:
        if isinstance(streams, StreamEvents) or not isinstance(streams, Sequence):
            raise InvalidRequestError("append_streams takes a list of StreamEvents")
        if not isinstance(metadata, EventMetadata):
            raise InvalidRequestError(f"metadata must be an EventMetadata, not {type(metadata)}")
        items: list[tuple[object, object, object]] = []
        for entry in streams:
            if not isinstance(entry, StreamEvents):
                raise InvalidRequestError(f"{entry!r} is not a StreamEvents")
            items.append((entry.stream_id, entry.events, entry.expected_version))
        registry = self.registry

        def convert(event: object) -> object:
            if registry is None and type(event) is NewEvent:
                return event
            return self._to_new_event(event, metadata)

        return build_appends(items, convert=convert,
                             stream_from=self.recorder.streams_appends_from)

    def append(self, stream_id: str, events: Sequence[NewEvent | BaseModel], *,
               expected_version: ExpectedVersion = ANY,
               metadata: EventMetadata = EMPTY_METADATA) -> AppendResult:
        """Append ``events`` to one stream if its version matches ``expected_version`` (an
        exact version, ``NO_STREAM``, ``STREAM_EXISTS`` or ``ANY``). ``metadata`` applies to
        model events (``NewEvent``s carry their own).

        Atomic: all events are stored, or none and a typed error says why
        (``WrongExpectedVersionError`` with the actual version, ``StreamDeletedError``,
        ``IdempotencyConflictError``, ``InvalidRequestError``, ``UnknownEventTypeError``,
        ``InvalidEventDataError``). Idempotent: resending events whose ids are stored returns the
        original result (``duplicate=True``). Global positions in the result are ``None``
        until the events are visible to global readers; see ``wait_for_positions``."""
        return self.append_streams([StreamEvents(stream_id, events, expected_version)],
                                   metadata=metadata)

    def append_streams(self, streams: Sequence[StreamEvents], *,
                       metadata: EventMetadata = EMPTY_METADATA) -> AppendResult:
        """Append to several streams atomically: every expected version must match, and
        either all events are stored or none is."""
        return self.recorder.append(self._prepare(streams, metadata))

    @contextmanager
    def transaction(self) -> Iterator[UnitOfWork]:
        """A PostgreSQL transaction for appends, checkpoints and the caller's own writes
        (``UnitOfWork.connection``); committed when the block ends, rolled back on error."""
        recorder = self.recorder
        if not isinstance(recorder, PostgresRecorder):
            raise EventStoreTerminalError("transactions need the PostgreSQL event store")
        with recorder.connection() as conn:
            with conn.transaction():
                unit = UnitOfWork(self, conn)
                yield unit
            if unit.appended:
                recorder.poke()

    def wait_for_positions(self, result: AppendResult, *, timeout_s: float = 10.0
                           ) -> AppendResult:
        """``result`` with every global position filled in, once the events are visible to
        global readers. Raises ``WatermarkHeldError`` (transient), naming the transaction that
        holds the watermark, when that takes longer than ``timeout_s``."""
        finite_seconds(timeout_s, "timeout_s")
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while True:
            missing = [e.event_id for e in result.events if e.position is None]
            if not missing:
                return result
            self.recorder.sequence()
            found = self.recorder.positions_of(missing)
            result = replace(result, events=tuple(
                replace(e, position=found.get(e.event_id)) if e.position is None else e
                for e in result.events
            ))
            if all(e.position is not None for e in result.events):
                return result
            if time.monotonic() >= deadline:
                status = self.status()
                holder = status.holder.describe() if status.holder else "an unknown transaction"
                raise WatermarkHeldError(
                    f"{len(missing)} appended events are not yet visible to global readers "
                    f"after {timeout_s:.1f} s: the watermark is held by {holder}; they become "
                    "visible when it ends"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    # -- reads --------------------------------------------------------------------------------

    def _decode(self, envelope: EventEnvelope) -> EventEnvelope:
        registry = self.registry
        if registry is None or (envelope.type not in registry and not envelope.is_deletion):
            return envelope
        return registry.decode_envelope(envelope)

    def _decode_all(self, envelopes: list[EventEnvelope]) -> list[EventEnvelope]:
        return envelopes if self.registry is None else [self._decode(e) for e in envelopes]

    def read_stream(self, stream_id: str, *, from_version: int | None = None,
                    backwards: bool = False, limit: int | None = None,
                    include_deleted: bool = False) -> list[EventEnvelope]:
        """The events of one stream in version order (``backwards``: newest first), from
        ``from_version`` inclusive. Immediately consistent: an append is visible here as soon
        as it commits. Events of a deleted stream are hidden (soft) or gone (hard); its
        deletion record stays."""
        check_stream_id(stream_id, allow_system=True)
        query = StreamQuery(from_version=from_version, backwards=backwards, limit=limit,
                            include_deleted=include_deleted)
        return self._decode_all(self.recorder.read_stream(stream_id, query))

    def read_all(self, from_position: int = 0, limit: int = 1000, *,
                 types: Sequence[str] | None = None, to_position: int | None = None,
                 include_deleted: bool = False) -> list[EventEnvelope]:
        """Up to ``limit`` events in global order from ``from_position`` (inclusive) to
        ``to_position`` (exclusive; None: the head), optionally only some types (deletion
        records always included). Fewer than ``limit`` events means the end was reached; to
        continue, pass the last event's position + 1."""
        query = LogQuery(from_position=from_position, limit=limit, to_position=to_position,
                         types=check_types(types),
                         include_deleted=include_deleted)
        return self._decode_all(self.recorder.read_log(query))

    def read_category(self, category: str, from_position: int = 0, limit: int = 1000, *,
                      types: Sequence[str] | None = None, to_position: int | None = None,
                      include_deleted: bool = False) -> list[EventEnvelope]:
        """Like ``read_all``, for the streams of one category (``order`` or ``order-``)."""
        query = LogQuery(from_position=from_position, limit=limit, to_position=to_position,
                         category=category, types=check_types(types),
                         include_deleted=include_deleted)
        return self._decode_all(self.recorder.read_log(query))

    def head(self) -> int:
        """The last global position visible to readers (0 when empty)."""
        return self.recorder.head()

    def stream_state(self, stream_id: str) -> StreamState:
        """A stream's current version (0: no events) and deletion state."""
        check_stream_id(stream_id, allow_system=True)
        return self.recorder.stream_state(stream_id)

    def seal(self, *, progress: Callable[[int, int], None] | None = None) -> Sealed:
        """Seal every complete range of the log that has no segment yet, now (the background
        sealer does this as the log grows; see ``StoreOptions.seal_segments``), calling
        ``progress(done, total)`` after each range. Bulk reads (``read_events_range``,
        Spark's ``lakefold_events``) read sealed ranges from their segments. Returns what was
        sealed; an in-memory store has nothing to seal."""
        return self.recorder.seal(progress=progress)

    def status(self) -> EventStoreStatus:
        """Head, events waiting for the watermark, and the transaction holding it when it has
        been held longer than ``StoreOptions.watermark_threshold_s``."""
        return self.recorder.status(self.options.watermark_threshold_s)

    # -- deletion -----------------------------------------------------------------------------

    def delete_stream(self, stream_id: str, *, expected_version: ExpectedVersion = ANY,
                      hard: bool = False) -> EventEnvelope:
        """Delete a stream and return the deletion record appended to it (type
        ``$stream.deleted``; projections receive it in every read and subscription).

        Soft (default): the stream's events are hidden from reads but kept (readable with
        ``include_deleted=True`` for replays). Hard: they are erased, for erasure requests;
        only the deletion record remains. A deleted stream cannot be appended to; a soft-deleted
        one can still be hard-deleted."""
        check_stream_id(stream_id)
        if not isinstance(hard, bool):
            raise InvalidRequestError(f"hard must be True or False, not {hard!r}")
        expected = normalise_expected(expected_version)
        event_id = new_event_id()
        self.recorder.delete_stream(stream_id, expected_version=expected, hard=hard,
                                    event_id=event_id)
        record = self.recorder.read_stream(stream_id, StreamQuery(backwards=True, limit=1))
        return self._decode(record[0])

    # -- subscriptions ------------------------------------------------------------------------

    def subscribe(self, name: str, options: SubscriptionOptions | None = None
                  ) -> Subscription:
        """A durable subscription: starts after the checkpoint saved under ``name`` (or at the
        beginning), delivers at least once, in position order."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequestError(f"subscription name {name!r} is invalid: use a non-empty str")
        start = self.recorder.load_checkpoint(name) or 0
        return Subscription(self.recorder, name=name, options=options or SubscriptionOptions(),
                            start_after=start, decode=self._decode_or_none())

    def tail(self, options: SubscriptionOptions | None = None, *,
             from_position: int | None = None) -> Subscription:
        """An ephemeral subscription (no checkpoint) from ``from_position`` (inclusive; None:
        only events after the current head)."""
        if from_position is None:
            start = self.head()
        else:
            start = max(check_position(from_position, "from_position") - 1, 0)
        return Subscription(self.recorder, name=None, options=options or SubscriptionOptions(),
                            start_after=start, decode=self._decode_or_none())

    def load_checkpoint(self, name: str) -> int | None:
        """The checkpoint saved for subscription ``name`` (None: none yet)."""
        return self.recorder.load_checkpoint(name)

    def save_checkpoint(self, name: str, position: int) -> None:
        """Save subscription ``name``'s checkpoint (its own transaction; see ``transaction()``
        to commit it with your writes)."""
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"checkpoint name {name!r} is invalid: use a non-empty str")
        self.recorder.save_checkpoint(name, check_position(position, "position"))

    def _decode_or_none(self) -> Any:
        return None if self.registry is None else self._decode

    def __repr__(self) -> str:
        return f"<EventStore {type(self.recorder).__name__}>"

