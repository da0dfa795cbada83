"""Values that cross the event store's boundary: expected versions, appends and their results,
read queries, stream state and status. All frozen; inputs are validated on construction, so a
bad argument fails before anything touches the store."""

from __future__ import annotations

import enum
import json
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, overload

from lakefold.eventstore.exceptions import InvalidRequestError
from lakefold.schemas.events import (
    EMPTY_METADATA,
    SYSTEM_PREFIX,
    EventMetadata,
    NewEvent,
    category_of,
)

MAX_STREAM_ID_LENGTH: Final = 512
MAX_EVENTS_PER_APPEND: Final = 100_000


class Expected(enum.Enum):
    """Expected-version conditions other than an exact version."""

    ANY = "any"  #: append whatever the stream's version (creating it if needed)
    NO_STREAM = "no stream"  #: the stream must not exist yet
    STREAM_EXISTS = "stream exists"  #: the stream must exist (any version)


ANY: Final = Expected.ANY
NO_STREAM: Final = Expected.NO_STREAM
STREAM_EXISTS: Final = Expected.STREAM_EXISTS

#: An exact stream version (>= 1; 0 means "no stream") or one of the ``Expected`` conditions.
ExpectedVersion = int | Expected


def describe_expected(expected: ExpectedVersion) -> str:
    """Human words for an expected version, for error messages."""
    if isinstance(expected, Expected):
        return expected.value
    return f"version {expected}"


def normalise_expected(expected: object) -> ExpectedVersion:
    """Validate an expected version; 0 is the same as ``NO_STREAM``."""
    if isinstance(expected, Expected):
        return expected
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise InvalidRequestError(
            f"expected_version {expected!r} is invalid: pass an int >= 0 or one of "
            "ANY, NO_STREAM, STREAM_EXISTS"
        )
    if expected < 0:
        raise InvalidRequestError(
            f"expected_version {expected} is negative: stream versions start at 1 (0 or "
            "NO_STREAM for a new stream)"
        )
    return NO_STREAM if expected == 0 else expected


def check_stream_id(stream_id: object, *, allow_system: bool = False) -> str:
    """Validate a stream id: a non-empty string of at most 512 characters, no NUL, no
    surrounding spaces, not starting with ``$`` (reserved)."""
    if not isinstance(stream_id, str):
        raise InvalidRequestError(
            f"stream id {stream_id!r} is a {type(stream_id).__name__}, not a str")
    if not stream_id or stream_id != stream_id.strip():
        raise InvalidRequestError(
            f"stream id {stream_id!r} is empty or has surrounding spaces; use e.g. 'order-42'"
        )
    if len(stream_id) > MAX_STREAM_ID_LENGTH:
        raise InvalidRequestError(
            f"stream id {stream_id[:40]!r}... is {len(stream_id)} characters long; the limit "
            f"is {MAX_STREAM_ID_LENGTH}"
        )
    if "\x00" in stream_id:
        raise InvalidRequestError(f"stream id {stream_id!r} contains a NUL character")
    if stream_id.startswith(SYSTEM_PREFIX) and not allow_system:
        raise InvalidRequestError(
            f"stream id {stream_id!r} starts with {SYSTEM_PREFIX!r}, which is reserved for "
            "lakefold; pick another id"
        )
    if not category_of(stream_id):
        raise InvalidRequestError(
            f"stream id {stream_id!r} has an empty category (it starts with '-'); use "
            "'<category>-<id>', e.g. 'order-42'"
        )
    return stream_id


def check_category(category: object) -> str:
    """Validate a category name; a trailing ``-`` is accepted (``order-`` is ``order``)."""
    if not isinstance(category, str):
        raise InvalidRequestError(f"category {category!r} is not a str")
    name = category[:-1] if category.endswith("-") else category
    if not name or "-" in name or name != name.strip() or "\x00" in name:
        raise InvalidRequestError(
            f"category {category!r} is invalid: a category is the part of a stream id before "
            "its first '-', e.g. 'order' for 'order-42'"
        )
    return name


def check_types(types: object) -> tuple[str, ...] | None:
    """Validate an event-type filter: None (all types) or a non-empty collection of names."""
    if types is None:
        return None
    if isinstance(types, str) or not isinstance(types, Sequence | frozenset | set):
        raise InvalidRequestError(f"types {types!r} must be a list of event type names, or None")
    names = tuple(types)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise InvalidRequestError(f"types {types!r} must be a non-empty list of non-empty names")
    return names


def check_position(value: object, what: str) -> int:
    """Validate a global position argument (an int >= 0)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"{what} {value!r} is invalid: positions are ints >= 0")
    return value


def check_limit(value: object) -> int:
    """Validate a read limit (an int >= 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(f"limit {value!r} is invalid: pass an int >= 1")
    return value


# One encoder for every payload, called directly: ``JSONEncoder.encode`` builds a new C
# encoder (and a dict of the containers it visits, to catch cycles) on every call, ~40% of a
# small payload's encoding. Without that dict a cycle ends in RecursionError, caught below.
# The arguments: no cycle markers, the default hook (raises TypeError), the string encoder,
# no indent, separators ":" and ",", keys unsorted, none skipped, NaN and infinities refused.
_ENCODE: Final = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, json.JSONEncoder().default, json.encoder.encode_basestring, None, ":", ",",
    False, False, False)
# Type names already checked (the check runs once per name, not once per event).
_CHECKED_TYPES: set[str] = set()


def _json_text(value: object, what: str) -> str:
    try:
        text = "".join(_ENCODE(value, 0))
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(
            f"{what} is not JSON-serialisable ({e}); use str/int/float/bool/None, lists and "
            "dicts with str keys, or a registered pydantic model"
        ) from e
    except RecursionError as e:
        raise InvalidRequestError(
            f"{what} contains itself (a reference cycle) or is nested too deeply for JSON"
        ) from e
    if "\\u0000" in text:
        raise InvalidRequestError(
            f"{what} contains a NUL character, which PostgreSQL jsonb rejects")
    return text


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """A validated ``NewEvent`` with its JSON texts, ready for a recorder."""

    event: NewEvent
    data_json: str
    metadata_json: str


def _check_type(name: object, index: int) -> None:
    if not isinstance(name, str) or not name or name != name.strip():
        raise InvalidRequestError(f"event #{index} has an invalid type {name!r}")
    if name.startswith(SYSTEM_PREFIX):
        raise InvalidRequestError(
            f"event #{index} has type {name!r}; types starting with {SYSTEM_PREFIX!r} are "
            "written by lakefold only"
        )
    if len(_CHECKED_TYPES) < 10_000:
        _CHECKED_TYPES.add(name)


def _check_metadata(metadata: object, index: int) -> str:
    if not isinstance(metadata, EventMetadata):
        raise InvalidRequestError(f"event #{index} has metadata {metadata!r}, not an EventMetadata")
    for name in ("correlation_id", "causation_id"):
        value = getattr(metadata, name)
        if value is not None and not isinstance(value, uuid.UUID):
            raise InvalidRequestError(f"event #{index} has metadata.{name} {value!r}, not a UUID")
    if not isinstance(metadata.extra, Mapping):
        raise InvalidRequestError(f"event #{index} has metadata.extra that is not a dict")
    if not metadata.extra:
        return "{}"
    return _json_text(metadata.extra, f"event #{index} metadata.extra")


def encode_event(event: object, index: int) -> EncodedEvent:
    """Validate one ``NewEvent`` and serialise its data and free-form metadata."""
    if not isinstance(event, NewEvent):
        raise InvalidRequestError(
            f"event #{index} is a {type(event).__name__}, not a NewEvent (or a registered "
            "pydantic model when the store has a registry)"
        )
    if type(event.type) is not str or event.type not in _CHECKED_TYPES:
        _check_type(event.type, index)
    version = event.schema_version
    if type(version) is not int or version < 1:
        raise InvalidRequestError(f"event #{index} has schema_version {version!r}; use an int >= 1")
    if not isinstance(event.event_id, uuid.UUID):
        raise InvalidRequestError(f"event #{index} has event_id {event.event_id!r}, not a UUID")
    data = event.data
    if type(data) is not dict and not isinstance(data, Mapping):
        raise InvalidRequestError(
            f"event #{index} ({event.type}) has data of type {type(data).__name__}; "
            "data must be a JSON object (a dict)"
        )
    metadata = event.metadata
    metadata_json = "{}" if metadata is EMPTY_METADATA else _check_metadata(metadata, index)
    return EncodedEvent(event, _json_text(data, f"event #{index} ({event.type}) data"),
                        metadata_json)


class StreamedEvents(Sequence[EncodedEvent]):
    """A large append's events, validated and encoded while they are consumed.

    ``build_appends(..., stream_from=n)`` leaves the events of an append of ``n`` events or
    more in one of these, so a recorder that writes them as a stream (COPY) encodes each
    event just before sending it, while the server inserts the ones before: client and server
    work at the same time instead of in turn. The first iteration validates and encodes (with
    the same checks and errors as ``encode_event``, and the check that no event id appears
    twice in the call); later ones reuse its result. A recorder that takes these must consume
    every event before it commits, so an invalid event still means nothing is written.
    """

    __slots__ = ("_convert", "_encoded", "_raw", "_seen", "_start")

    def __init__(self, raw: Sequence[object], *, start: int, seen: dict[int, int],
                 convert: Callable[[object], object] | None) -> None:
        self._raw = raw
        self._start = start
        self._seen = seen
        self._convert = convert
        self._encoded: tuple[EncodedEvent, ...] | None = None

    def __len__(self) -> int:
        return len(self._raw)

    def __iter__(self) -> Iterator[EncodedEvent]:
        if self._encoded is not None:
            yield from self._encoded
            return
        done: list[EncodedEvent] = []
        convert, seen = self._convert, self._seen
        for index, event in enumerate(self._raw, start=self._start):
            encoded = encode_event(event if convert is None else convert(event), index)
            _check_unique_id(encoded, index, seen)
            done.append(encoded)
            yield encoded
        self._encoded = tuple(done)

    @overload
    def __getitem__(self, item: int) -> EncodedEvent: ...
    @overload
    def __getitem__(self, item: slice) -> Sequence[EncodedEvent]: ...
    def __getitem__(self, item: int | slice) -> EncodedEvent | Sequence[EncodedEvent]:
        if self._encoded is None:
            for _ in self:
                pass
        assert self._encoded is not None  # noqa: S101 - set by the loop above
        return self._encoded[item]


def _check_unique_id(encoded: EncodedEvent, index: int, seen: dict[int, int]) -> None:
    """Record ``encoded``'s id as event #``index``'s; an id used by another event of the same
    call is an error (``seen`` maps ids to the index that claimed them, so encoding an event
    again is not a duplicate)."""
    if seen.setdefault(encoded.event.event_id.int, index) != index:
        raise InvalidRequestError(
            f"event id {encoded.event.event_id} appears twice in one append; every event "
            "needs its own id"
        )


@dataclass(frozen=True, slots=True)
class StreamAppend:
    """Events to append to one stream, with the stream's expected version. ``events`` is a
    tuple, or ``StreamedEvents`` for a large append (see ``build_appends``)."""

    stream_id: str
    events: Sequence[EncodedEvent]
    expected_version: ExpectedVersion = ANY

    @property
    def category(self) -> str:
        return category_of(self.stream_id)


def build_appends(items: Sequence[tuple[object, object, object]], *,
                  convert: Callable[[object], object] | None = None,
                  stream_from: int | None = None) -> tuple[StreamAppend, ...]:
    """Validate ``(stream_id, events, expected_version)`` triples into ``StreamAppend``s: each
    stream at most once, at least one event each, event ids unique across the call.
    ``convert`` turns each event into a ``NewEvent`` first (a registry's encoding).

    With ``stream_from``, the events of a call of that many events or more are left in
    ``StreamedEvents``: validated and encoded while the recorder consumes them (the caller's
    recorder must consume them all before committing). Otherwise every event is validated
    here, before anything touches the store."""
    if not items:
        raise InvalidRequestError("nothing to append: pass at least one stream with events")
    checked: list[tuple[str, Sequence[object], ExpectedVersion]] = []
    seen_streams: set[str] = set()
    total = 0
    for stream_id, events, expected in items:
        sid = check_stream_id(stream_id)
        if sid in seen_streams:
            raise InvalidRequestError(
                f"stream {sid!r} appears twice in one append; put all its events in one entry"
            )
        seen_streams.add(sid)
        if isinstance(events, NewEvent | str | bytes | Mapping) or not isinstance(
            events, Sequence
        ):
            raise InvalidRequestError(f"events for stream {sid!r} must be a list of events")
        if not events:
            raise InvalidRequestError(f"no events to append to stream {sid!r}")
        checked.append((sid, events, normalise_expected(expected)))
        total += len(events)
    if total > MAX_EVENTS_PER_APPEND:
        raise InvalidRequestError(
            f"{total} events in one append; the limit is {MAX_EVENTS_PER_APPEND}: split it"
        )
    seen_ids: dict[int, int] = {}
    appends: list[StreamAppend] = []
    start = 0
    for sid, events, expected in checked:
        streamed = StreamedEvents(events, start=start, seen=seen_ids, convert=convert)
        start += len(events)
        appends.append(StreamAppend(
            sid, streamed if stream_from is not None and total >= stream_from
            else tuple(streamed), expected))
    return tuple(appends)


@dataclass(frozen=True, slots=True)
class AppendedEvent:
    """Where an appended event went. ``position`` is ``None`` until the event is visible to
    global readers (PostgreSQL assigns it after commit; see ``EventStore.wait_for_positions``)."""

    event_id: uuid.UUID
    stream_id: str
    stream_version: int
    position: int | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The outcome of an append. ``duplicate`` is True when every event was already stored
    (an idempotent retry): the result then describes the original append and nothing was
    written."""

    events: tuple[AppendedEvent, ...]
    duplicate: bool = False

    @property
    def stream_versions(self) -> dict[str, int]:
        """Each stream's version after the append."""
        versions: dict[str, int] = {}
        for event in self.events:
            versions[event.stream_id] = max(versions.get(event.stream_id, 0),
                                            event.stream_version)
        return versions

    @property
    def positions(self) -> list[int | None]:
        """The global positions of the appended events, in append order."""
        return [event.position for event in self.events]


@dataclass(frozen=True, slots=True)
class LogQuery:
    """A read of the global log: positions ``[from_position, to_position)`` (``to_position``
    None: up to the head), at most ``limit`` events, optionally one category and/or some types.
    Deletion records are always included under a type filter; events of soft-deleted streams
    only with ``include_deleted``."""

    from_position: int = 0
    limit: int = 1000
    to_position: int | None = None
    category: str | None = None
    types: tuple[str, ...] | None = None
    include_deleted: bool = False

    def __post_init__(self) -> None:
        check_position(self.from_position, "from_position")
        check_limit(self.limit)
        if self.to_position is not None:
            check_position(self.to_position, "to_position")
        if self.category is not None:
            object.__setattr__(self, "category", check_category(self.category))
        object.__setattr__(self, "types", check_types(self.types))


@dataclass(frozen=True, slots=True)
class StreamQuery:
    """A read of one stream from ``from_version`` (inclusive; None: the first event going
    forwards, the last going backwards), at most ``limit`` events (None: all)."""

    from_version: int | None = None
    backwards: bool = False
    limit: int | None = None
    include_deleted: bool = False

    def __post_init__(self) -> None:
        if self.from_version is not None and (
            isinstance(self.from_version, bool) or not isinstance(self.from_version, int)
            or self.from_version < 0
        ):
            raise InvalidRequestError(
                f"from_version {self.from_version!r} is invalid: use an int >= 0")
        if self.limit is not None:
            check_limit(self.limit)


@dataclass(frozen=True, slots=True)
class StreamState:
    """A stream's version (0: it has no events) and deletion state (None, 'soft' or 'hard')."""

    stream_id: str
    version: int
    deleted: str | None = None

    @property
    def exists(self) -> bool:
        return self.version > 0


@dataclass(frozen=True, slots=True)
class Sequenced:
    """The result of a sequencing round: the head (last position visible to readers) and
    whether committed events are still waiting for the watermark."""

    head: int
    pending: bool


@dataclass(frozen=True, slots=True)
class WatermarkHolder:
    """The oldest running transaction that holds an xid, i.e. the one holding the watermark
    (from pg_stat_activity; ``query`` may read '<insufficient privilege>'). ``query`` is for a
    caller's own diagnosis only: a statement can hold card numbers or passwords, so
    ``describe``, ``as_dict`` (``--json``), logs and errors show the pid, user, database,
    application, state and age, never the statement."""

    pid: int | None
    database: str | None
    user: str | None
    application: str | None
    state: str | None
    xact_start: datetime | None
    held_for_s: float
    query: str | None
    prepared_gid: str | None = None

    def describe(self) -> str:
        if self.prepared_gid is not None:
            return (f"prepared transaction {self.prepared_gid!r} in database {self.database}, "
                    f"held for {self.held_for_s:.1f} s")
        return (f"pid {self.pid} ({self.user}@{self.database}, {self.application or '-'}, "
                f"{self.state}), transaction started {self.xact_start}, held for "
                f"{self.held_for_s:.1f} s")


@dataclass(frozen=True, slots=True)
class Sealed:
    """What a sealing run did: segments and events written, the head it sealed up to, and
    whether it stopped early (a deletion was under way, or it was asked to stop); a later run
    seals the rest."""

    segments: int = 0
    events: int = 0
    head: int = 0
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class EventStoreStatus:
    """Head, events waiting for the watermark, and whether it has been held too long;
    sealed segments and the positions up to the head not in one (the unsealed tail, below one
    segment's length when sealing keeps up, and ranges whose segment a deletion dropped)."""

    head: int
    pending_events: int
    oldest_pending_at: datetime | None
    sequenced_at: datetime | None
    holder: WatermarkHolder | None
    threshold_s: float
    held: bool = field(default=False)
    segments: int = 0
    unsealed_positions: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``--json``)."""
        holder = None
        if self.holder is not None:
            holder = {
                "pid": self.holder.pid, "database": self.holder.database,
                "user": self.holder.user, "application": self.holder.application,
                "state": self.holder.state,
                "xact_start": self.holder.xact_start.isoformat()
                if self.holder.xact_start else None,
                "held_for_s": round(self.holder.held_for_s, 3),
                "prepared_gid": self.holder.prepared_gid,
            }
        return {
            "head": self.head,
            "pending_events": self.pending_events,
            "oldest_pending_at": self.oldest_pending_at.isoformat()
            if self.oldest_pending_at else None,
            "sequenced_at": self.sequenced_at.isoformat() if self.sequenced_at else None,
            "watermark_held": self.held,
            "threshold_s": self.threshold_s,
            "holder": holder,
            "segments": self.segments,
            "unsealed_positions": self.unsealed_positions,
        }


def positive_int(value: object, what: str) -> int:
    """Validate a count (an int >= 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(f"{what} {value!r} is invalid: use an int >= 1")
    return value


def finite_seconds(value: object, what: str) -> float:
    """Validate a duration in seconds (a finite number >= 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
        value
    ) or value < 0:
        raise InvalidRequestError(f"{what} {value!r} is invalid: pass seconds as a number >= 0")
    return float(value)
