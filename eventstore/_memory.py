"""An in-memory recorder: the reference implementation of the recorder port, for tests and
prototypes. One lock serialises every operation, so positions are assigned at append time and
the global order is trivially gap-free. Nothing survives the process."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lakefold.eventstore._model import (
    AppendedEvent,
    AppendResult,
    EncodedEvent,
    EventStoreStatus,
    Expected,
    ExpectedVersion,
    LogQuery,
    Sequenced,
    StreamAppend,
    StreamQuery,
    StreamState,
    describe_expected,
)
from lakefold.eventstore._recorder import EventRecorder, Waiter
from lakefold.eventstore.exceptions import (
    IdempotencyConflictError,
    StreamDeletedError,
    WrongExpectedVersionError,
)
from lakefold.schemas.events import (
    EMPTY_METADATA,
    STREAM_DELETED_TYPE,
    EventEnvelope,
    EventMetadata,
    category_of,
)


@dataclass
class _Stream:
    version: int = 0
    deleted: str | None = None


@dataclass
class _Stored:
    envelope: EventEnvelope
    hidden: bool = False


class _ConditionWaiter(Waiter):
    def __init__(self, recorder: InMemoryRecorder) -> None:
        self._recorder = recorder
        self._seen = recorder._head

    def wait(self, timeout: float) -> bool:
        with self._recorder._changed:
            woken = self._recorder._changed.wait_for(
                lambda: self._recorder._head != self._seen, timeout=timeout
            )
            self._seen = self._recorder._head
            return woken

    def close(self) -> None:
        return None


def _stored_metadata(encoded: EncodedEvent) -> EventMetadata:
    """The metadata of ``encoded`` as it is stored and read back (its JSON round trip)."""
    meta = encoded.event.metadata
    metadata = EventMetadata(meta.correlation_id, meta.causation_id,
                             json.loads(encoded.metadata_json))
    return EMPTY_METADATA if metadata == EMPTY_METADATA else metadata


def _check_expected(stream_id: str, stream: _Stream | None,
                    expected: ExpectedVersion) -> None:
    if stream is not None and stream.deleted is not None:
        raise StreamDeletedError(stream_id, mode=stream.deleted)
    version = stream.version if stream is not None else 0
    ok = (
        expected is Expected.ANY
        or (expected is Expected.NO_STREAM and version == 0)
        or (expected is Expected.STREAM_EXISTS and version > 0)
        or (isinstance(expected, int) and version == expected)
    )
    if not ok:
        raise WrongExpectedVersionError(stream_id, expected=describe_expected(expected),
                                   actual_version=version or None)


class InMemoryRecorder(EventRecorder):
    """Keeps events in lists and dicts; thread-safe; positions are assigned on append."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._log: list[_Stored | None] = []  # index = position - 1; None = erased
        self._streams: dict[str, _Stream] = {}
        self._by_stream: dict[str, list[int]] = {}  # stream id -> positions in version order
        self._by_id: dict[uuid.UUID, int] = {}
        self._checkpoints: dict[str, int] = {}
        self._head = 0

    def install(self) -> None:
        return None

    # -- append -------------------------------------------------------------------------------

    def _duplicate(self, appends: Sequence[StreamAppend]) -> AppendResult | None:
        items = [(a, e) for a in appends for e in a.events]
        stored = [self._by_id.get(e.event.event_id) for _, e in items]
        if all(p is None for p in stored):
            return None
        if any(p is None for p in stored):
            raise IdempotencyConflictError(
                f"{sum(p is not None for p in stored)} of the {len(stored)} event ids of this "
                "append are already stored; a retry must resend exactly the original events "
                "(nothing was written)"
            )
        results = []
        for (append, encoded), position in zip(items, stored, strict=True):
            entry = self._log[position - 1] if position is not None else None
            if entry is None:  # erased by a hard delete since
                raise StreamDeletedError(append.stream_id, mode="hard")
            env = entry.envelope
            event = encoded.event
            retried = (append.stream_id, event.type, event.schema_version)
            same_data = env.data == json.loads(encoded.data_json)
            same_metadata = env.metadata == _stored_metadata(encoded)
            if (env.stream_id, env.type, env.schema_version) != retried \
                    or not (same_data and same_metadata):
                raise IdempotencyConflictError.differing(
                    env.event_id,
                    stored=(env.stream_id, env.stream_version, env.type, env.schema_version),
                    retried=retried, data=not same_data, metadata=not same_metadata)
            results.append(AppendedEvent(env.event_id, env.stream_id, env.stream_version,
                                         env.position))
        return AppendResult(tuple(results), duplicate=True)

    def append(self, appends: Sequence[StreamAppend]) -> AppendResult:
        with self._lock:
            duplicate = self._duplicate(appends)
            if duplicate is not None:
                return duplicate
            for append in appends:
                _check_expected(append.stream_id, self._streams.get(append.stream_id),
                                append.expected_version)
            now = datetime.now(UTC)
            results = []
            for append in appends:
                stream = self._streams.setdefault(append.stream_id, _Stream())
                for encoded in append.events:
                    stream.version += 1
                    envelope = self._store(append.stream_id, stream.version, encoded, now)
                    results.append(AppendedEvent(envelope.event_id, append.stream_id,
                                                 stream.version, envelope.position))
            self._changed.notify_all()
            return AppendResult(tuple(results))

    def _store(self, stream_id: str, version: int, encoded: EncodedEvent,
               now: datetime) -> EventEnvelope:
        event = encoded.event
        return self._store_envelope(EventEnvelope(
            event_id=event.event_id, stream_id=stream_id, stream_version=version,
            position=None, type=event.type, schema_version=event.schema_version,
            data_json=encoded.data_json, metadata=_stored_metadata(encoded), recorded_at=now,
        ))

    def _store_envelope(self, envelope: EventEnvelope) -> EventEnvelope:
        self._head += 1
        envelope = envelope.replace(position=self._head)
        self._log.append(_Stored(envelope))
        self._by_stream.setdefault(envelope.stream_id, []).append(self._head)
        self._by_id[envelope.event_id] = self._head
        return envelope

    # -- reads --------------------------------------------------------------------------------

    def read_stream(self, stream_id: str, query: StreamQuery) -> list[EventEnvelope]:
        with self._lock:
            entries = [self._log[p - 1] for p in self._by_stream.get(stream_id, [])]
            found = [e for e in entries if e is not None
                     and (query.include_deleted or not e.hidden)]
            if query.backwards:
                found.reverse()
                if query.from_version is not None:
                    found = [e for e in found if e.envelope.stream_version <= query.from_version]
            elif query.from_version is not None:
                found = [e for e in found if e.envelope.stream_version >= query.from_version]
            if query.limit is not None:
                found = found[: query.limit]
            return [e.envelope for e in found]

    def read_log(self, query: LogQuery) -> list[EventEnvelope]:
        types = None if query.types is None else {*query.types, STREAM_DELETED_TYPE}
        with self._lock:
            end = self._head if query.to_position is None else min(self._head,
                                                                   query.to_position - 1)
            found: list[EventEnvelope] = []
            for position in range(max(query.from_position, 1), end + 1):
                entry = self._log[position - 1]
                if entry is None or (entry.hidden and not query.include_deleted):
                    continue
                env = entry.envelope
                if query.category is not None and category_of(env.stream_id) != query.category:
                    continue
                if types is not None and env.type not in types:
                    continue
                found.append(env)
                if len(found) == query.limit:
                    break
            return found

    def sequence(self) -> Sequenced:
        with self._lock:
            return Sequenced(head=self._head, pending=False)

    def stream_state(self, stream_id: str) -> StreamState:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None:
                return StreamState(stream_id, 0)
            return StreamState(stream_id, stream.version, stream.deleted)

    def positions_of(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        with self._lock:
            return {i: self._by_id[i] for i in event_ids if i in self._by_id}

    # -- deletion -----------------------------------------------------------------------------

    def delete_stream(self, stream_id: str, *, expected_version: ExpectedVersion, hard: bool,
                      event_id: uuid.UUID) -> AppendedEvent:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is not None and stream.deleted is not None and (
                stream.deleted == "hard" or not hard
            ):
                raise StreamDeletedError(stream_id, mode=stream.deleted)
            version = stream.version if stream is not None else 0
            if stream is None or expected_version is Expected.NO_STREAM or (
                isinstance(expected_version, int) and expected_version != version
            ):
                raise WrongExpectedVersionError(stream_id, expected=describe_expected(
                    expected_version), actual_version=version or None)
            for position in self._by_stream.get(stream_id, []):
                entry = self._log[position - 1]
                if entry is None:
                    continue
                if hard:
                    self._log[position - 1] = None
                    del self._by_id[entry.envelope.event_id]
                else:
                    entry.hidden = True
            if hard:
                self._by_stream[stream_id] = []
            stream.deleted = "hard" if hard else "soft"
            stream.version += 1
            envelope = self._store_envelope(EventEnvelope(
                event_id=event_id, stream_id=stream_id, stream_version=stream.version,
                position=None, type=STREAM_DELETED_TYPE, schema_version=1,
                data_json=json.dumps({"stream_id": stream_id, "mode": stream.deleted,
                                      "last_version": version}),
                metadata=EMPTY_METADATA, recorded_at=datetime.now(UTC),
            ))
            self._changed.notify_all()
            return AppendedEvent(event_id, stream_id, stream.version, envelope.position)

    # -- checkpoints and waiting --------------------------------------------------------------

    def load_checkpoint(self, name: str) -> int | None:
        with self._lock:
            return self._checkpoints.get(name)

    def save_checkpoint(self, name: str, position: int) -> None:
        with self._lock:
            self._checkpoints[name] = position

    def open_waiter(self) -> Waiter:
        return _ConditionWaiter(self)

    def status(self, threshold_s: float) -> EventStoreStatus:
        with self._lock:
            return EventStoreStatus(head=self._head, pending_events=0, oldest_pending_at=None,
                                    sequenced_at=None, holder=None, threshold_s=threshold_s)
