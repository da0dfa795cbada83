"""Events as a view's input: the events of a category (or of some types) fed into a derived
stream keyed by global position, which the view's state reads like any captured table.

A view keeps each input's current rows in a state moved forward from a changelog stream (see
``_view_maintainer``). The event store is a log, not a changelog, so each event input of a view
generation has a *feed*: a derived stream (``lakefold_feeds.<view>_g<N>_<input>``) that holds
one row per event, keyed by ``position``, and its progress in ``lakefold.event_feeds`` (the
next global position to read). ``advance`` runs at the start of the view's batch: it reads
the events after the feed's position up to the store's head (every position up to the head is
final, see ``eventstore._sequencer``, so ``read_events_range`` reads them on a connection of
its own), and, in the batch's store transaction, appends them as inserts and moves the feed's
position, so a crash rolls the feed back with the batch.

Rows: the event's ``position``, ``event_id``, ``stream_id``, ``stream_version``,
``category``, ``type``, ``schema_version``, ``recorded_at``, ``correlation_id`` and
``causation_id``; then, with an event registry, the payload's top-level fields as columns,
typed by the registered models of the input's types and upcast to their current version
(a type lacking a field gives NULL); without one, ``data`` and ``metadata`` as JSON text.

A deleted stream (its ``$stream.deleted`` record) deletes the rows of its events: a view over
events equals the same query over the events a read of the store returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.capture.store._derived_streams import DerivedStream, column_for
from lakefold.capture.store._stream_schema import StreamSchema
from lakefold.capture.store._stream_state import StreamState
from lakefold.capture.store.exceptions import CaptureValueError
from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA, head_position, read_events_range
from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.schemas import EventRegistry
from lakefold.schemas.events import STREAM_DELETED_TYPE
from lakefold.spark._event_payloads import PayloadDecoder
from lakefold.spark.exceptions import SparkTerminalError

#: The event columns every event input has (payload columns follow).
EVENT_COLUMNS: Final = ("position", "event_id", "stream_id", "stream_version", "category",
                        "type", "schema_version", "recorded_at", "correlation_id",
                        "causation_id")
_DDL: Final = """CREATE TABLE IF NOT EXISTS lakefold.event_feeds (
    stream text PRIMARY KEY,
    next_position bigint NOT NULL DEFAULT 1)"""


@dataclass(frozen=True)
class EventInput:
    """What a view's event input reads: a category (None: all) and types (empty: all)."""

    category: str | None
    types: tuple[str, ...]

    @property
    def label(self) -> str:
        what = f"events of category {self.category}" if self.category else "all events"
        return what + (f" of types {', '.join(self.types)}" if self.types else "")


def feed_stream(view: str, generation: int, alias: str) -> str:
    """The derived stream that feeds event input ``alias`` of a generation of ``view``."""
    return f"lakefold_feeds.{view}_g{generation}_{alias}"


def payload_decoder(view: str, alias: str, source: EventInput,
                    registry: EventRegistry | None) -> PayloadDecoder | None:
    """What types an event input's payload columns (None without a registry)."""
    if registry is None:
        return None
    try:
        return PayloadDecoder(registry, source.types or None)
    except SparkTerminalError as e:
        raise ProjectionDefinitionError(f"view {view}: input {alias} ({source.label}): {e}") \
            from e


def event_schema(view: str, alias: str, decoder: PayloadDecoder | None) -> pa.Schema:
    """The columns of an event input's rows (see the module docstring); a payload field
    named like an event column, or of a type a view cannot hold, is refused."""
    fields = [EVENTS_ARROW_SCHEMA.field(name) for name in EVENT_COLUMNS]
    if decoder is None:
        fields += [EVENTS_ARROW_SCHEMA.field("data"), EVENTS_ARROW_SCHEMA.field("metadata")]
    else:
        for field in decoder.schema:
            if field.name in EVENT_COLUMNS:
                raise ProjectionDefinitionError(
                    f"view {view}: input {alias}: payload field {field.name!r} has the name "
                    f"of an event column ({', '.join(EVENT_COLUMNS)}); rename the field in "
                    "the model (a new version with an upcaster), or read the input without "
                    "registry= and take it from the data JSON")
            try:
                column_for(field, key=False)
            except CaptureValueError as e:
                raise ProjectionDefinitionError(
                    f"view {view}: input {alias}: payload field {e}; declare it as a "
                    "scalar, or read the input without registry= (data as JSON text)") from e
            fields.append(field)
    return pa.schema([pa.field(f.name, f.type) for f in fields])


class EventFeed:
    """One event input of one view generation, fed into its derived stream."""

    def __init__(self, store_dsn: str, *, view: str, stream: str, source: EventInput,
                 registry: EventRegistry | None) -> None:
        self.dsn = store_dsn
        self.source = source
        self.stream = DerivedStream(stream)
        self.name = stream
        self.decoder = payload_decoder(view, stream, source, registry)
        self.schema = event_schema(view, stream, self.decoder)
        self._stream_schema: StreamSchema | None = None

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the feed's stream and progress (idempotent)."""
        with conn.transaction():
            conn.execute(_DDL)
            conn.execute("INSERT INTO lakefold.event_feeds (stream) VALUES (%s) "
                         "ON CONFLICT DO NOTHING", (self.name,))
        self._stream_schema = self.stream.create(conn, self.schema, ["position"])

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Forget the feed's progress (``self.stream.drop`` deletes its stream)."""
        with conn.transaction():
            conn.execute(_DDL)
            conn.execute("DELETE FROM lakefold.event_feeds WHERE stream = %s", (self.name,))

    def position(self, conn: psycopg.Connection[Any]) -> int:
        """The next global position the feed reads (1: nothing fed yet)."""
        return feed_position(conn, self.name)

    def advance(self, conn: psycopg.Connection[Any], state: StreamState, head: int) -> int:
        """Feed the events after the feed's position up to ``head`` (the store's head, read
        before the caller's transaction began), in the caller's transaction; ``state`` is the
        view's state of this feed (to find the rows of a deleted stream). Returns the rows
        appended."""
        assert self._stream_schema is not None  # noqa: S101 - create() runs first
        start = int(conn.execute(
            "SELECT next_position FROM lakefold.event_feeds WHERE stream = %s FOR UPDATE",
            (self.name,)).fetchone()[0])  # type: ignore[index]
        end = max(start, head + 1)
        # Final below the head, so read on a connection of its own (sealed segments, binary
        # COPY): a stream deleted meanwhile shows as its deletion record in a later batch.
        events = pa.Table.from_batches(list(read_events_range(
            self.dsn, start, end, category=self.source.category,
            types=self.source.types or None)), schema=EVENTS_ARROW_SCHEMA)
        appended = self._append(conn, state, events)
        conn.execute("UPDATE lakefold.event_feeds SET next_position = %s WHERE stream = %s",
                     (end, self.name))
        return appended

    def _append(self, conn: psycopg.Connection[Any], state: StreamState,
                events: pa.Table) -> int:
        if events.num_rows == 0:
            return 0
        deletion = pc.equal(events.column("type"), STREAM_DELETED_TYPE)
        deletes = self._deleted_rows(conn, state, events.filter(deletion))
        events = events.filter(pc.invert(deletion))
        if deletes.num_rows:  # events of a deleted stream read in this very range
            gone = pc.is_in(events.column("stream_id"), deletes.column("stream_id").unique())
            events = events.filter(pc.invert(gone))
        rows = self._rows(events)
        old = pa.Table.from_pylist([{}] * rows.num_rows, schema=rows.schema)
        assert self._stream_schema is not None  # noqa: S101 - create() runs first
        top = events.column("recorded_at")
        moment = pc.max(top).as_py() if events.num_rows else datetime.now(UTC)
        start, end = self.stream.append(conn, self._stream_schema, upserts=rows, old=old,
                                        deletes=deletes, commit_lsn=0, commit_ts=moment)
        return end - start

    def _rows(self, events: pa.Table) -> pa.Table:
        """The feed's rows of ``events`` (see the module docstring)."""
        base = events.select(list(EVENT_COLUMNS))
        if self.decoder is None:
            return base.append_column("data", events.column("data")) \
                .append_column("metadata", events.column("metadata")).cast(self.schema)
        payload = self.decoder.decode(events.column("type").combine_chunks(),
                                      events.column("schema_version").combine_chunks(),
                                      events.column("data").combine_chunks())
        for index, field in enumerate(self.decoder.schema):
            base = base.append_column(field.name, payload.field(index))
        return base.cast(self.schema)

    def _deleted_rows(self, conn: psycopg.Connection[Any], state: StreamState,
                      records: pa.Table) -> pa.Table:
        """The fed rows of the streams whose deletion records are in ``records``."""
        streams = {json.loads(d).get("stream_id") or s for d, s in zip(
            records.column("data").to_pylist(), records.column("stream_id").to_pylist(),
            strict=True)}
        if not streams:
            return self.schema.empty_table()
        raw = state.rows_where(conn, "stream_id", streams)
        return _data(state.typed(conn, raw)).cast(self.schema)


def feed_position(conn: psycopg.Connection[Any], stream: str) -> int:
    """The next global position the feed ``stream`` reads (1: nothing fed yet)."""
    row = conn.execute("SELECT next_position FROM lakefold.event_feeds WHERE stream = %s",
                       (stream,)).fetchone()
    return 1 if row is None else int(row[0])


def _data(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in table.column_names if c.startswith("_")])


def store_head(store_dsn: str) -> int:
    """The event store's head (0 when it holds nothing or is not installed)."""
    from lakefold.eventstore import EventStoreNotInstalledError

    try:
        return head_position(store_dsn)
    except EventStoreNotInstalledError:
        return 0
