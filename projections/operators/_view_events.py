"""Events as a view's input: the events of a category (or of some types) fed into a derived
stream keyed by global position, which the view's state reads like any captured table.

A view keeps each input's current rows in a state moved forward from a changelog stream (see
``_view_core``). The event store is a log, not a changelog, so each event input of a view
generation has a *feed*: a derived stream (``lakefold_feeds.<view>_g<N>_<input>``) that holds
one row per event, keyed by ``position``, and its progress in ``lakefold.event_feeds`` (the
next global position to read). ``advance`` runs at the start of the view's batch: it reads
the events after the feed's position up to the store's head, at most the view's
``max_records_per_batch`` positions at a time (every position up to the head is
final, see ``eventstore._sequencer``, so ``read_events_range`` reads them on a connection of
its own), and, in the batch's store transaction, appends them as inserts and moves the feed's
position, so a crash rolls the feed back with the batch.

Rows: the event's ``position``, ``event_id``, ``stream_id``, ``stream_version``,
``category``, ``type``, ``schema_version``, ``recorded_at``, ``correlation_id`` and
``causation_id``; then, with an event registry, the payload's top-level fields as columns,
typed by the registered models of the input's types and upcast to their current version
(a type lacking a field gives NULL); without one, ``data`` and ``metadata`` as JSON text.

An input with lookups (``_lookups``) has their tables' columns after those, as of each event's
commit, filled in when the event is fed; such a feed feeds an event once the capture has
stored its commit marker (``EventFeed._commit_gate``).

A deleted stream (its ``$stream.deleted`` record) deletes the rows of its events: a view over
events equals the same query over the events a read of the store returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA, head_position, read_events_range
from lakefold.eventstore.internals import wal_insert_lsn
from lakefold.projections.definitions._view_inputs import EventInput
from lakefold.projections.definitions._windows import (
    TIME_TYPE,
    WINDOW_END,
    WINDOW_START,
    Window,
    classify,
    event_times,
    is_time_type,
    moment,
)
from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.projections.operators._lookups import CommitOrder, Enricher, enrichment_fields
from lakefold.projections.operators._session_windows import assign_sessions
from lakefold.projections.state._deadletters import (
    NewDeadLetter,
    add_dead_letters,
    install_dead_letters,
)
from lakefold.projections.state._deleted_events import (
    DeletedTimes,
    TimeSource,
    in_range,
    install_deleted_times,
    of_keys,
    record,
)
from lakefold.projections.state._late_events import (
    forget_late_streams,
    install_late_events,
    pending_replays,
    record_late,
)
from lakefold.projections.state._stream_state import LatestRows
from lakefold.schemas import EventRegistry
from lakefold.schemas.events import STREAM_DELETED_TYPE
from lakefold.spark.exceptions import SparkTerminalError
from lakefold.spark.internals import PayloadDecoder
from lakefold.store.exceptions import CaptureValueError
from lakefold.store.internals import (
    DerivedStream,
    StreamSchema,
    column_for,
    data_columns,
    text_array,
)

if TYPE_CHECKING:
    from lakefold.projections.operators._window_aggregates import WindowAggregates

#: The event columns every event input has (payload columns follow).
EVENT_COLUMNS: Final = ("position", "event_id", "stream_id", "stream_version", "category",
                        "type", "schema_version", "recorded_at", "correlation_id",
                        "causation_id")
#: The feeds' progress (also of windowed tables' feeds, ``_changelog_windows``).
FEED_DDL: Final = [
    """CREATE TABLE IF NOT EXISTS lakefold.event_feeds (
        stream text PRIMARY KEY,
        next_position bigint NOT NULL DEFAULT 1)""",
    # A windowed feed's largest event time (microseconds since the epoch) and the last late
    # event replay it folded in (``_late_events``); added after the first release.
    """ALTER TABLE lakefold.event_feeds ADD COLUMN IF NOT EXISTS max_event_time bigint,
        ADD COLUMN IF NOT EXISTS replayed_through bigint NOT NULL DEFAULT 0""",
    # The WAL position and store head a feed with lookups as of commit marked (see
    # ``EventFeed._commit_gate``); added after the first release.
    """ALTER TABLE lakefold.event_feeds ADD COLUMN IF NOT EXISTS mark_lsn bigint,
        ADD COLUMN IF NOT EXISTS mark_head bigint""",
]
FEEDS: Final = migrations.register("event_feeds", Migration(1, "progress of view feeds",
                                                            *FEED_DDL))


def install_feeds(conn: psycopg.Connection[Any]) -> None:
    """Create the feeds' progress table if missing (migrates component ``event_feeds``)."""
    migrations.migrate(conn, FEEDS)


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


def event_schema(view: str, alias: str, decoder: PayloadDecoder | None,
                 window: Window | None = None,
                 enrichment: Sequence[pa.Field] = ()) -> pa.Schema:
    """The columns of an event input's rows (see the module docstring), with the window
    columns when ``window`` is over this input; a payload field named like an event column,
    or of a type a view cannot hold, and a window over a column that is not a time, are
    refused."""
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
    schema = pa.schema([pa.field(f.name, f.type) for f in fields] + list(enrichment))
    return schema if window is None else windowed_schema(view, alias, schema, window)


def check_time_column(view: str, alias: str, schema: pa.Schema, column: str,
                      what: str) -> None:
    """Refuse ``what`` (a window, a join) over ``alias.column`` unless the input has that
    column and it can hold an event time."""
    if column not in schema.names:
        raise ProjectionDefinitionError(
            f"view {view}: the {what} is over {alias}.{column}, but input {alias} has no "
            f"column {column!r}; its columns are {', '.join(schema.names)}")
    if not is_time_type(schema.field(column).type):
        raise ProjectionDefinitionError(
            f"view {view}: the {what} is over {alias}.{column}, of type "
            f"{schema.field(column).type}, which is not a time; use a timestamp (or "
            "ISO-8601 text) column")


def windowed_schema(view: str, alias: str, schema: pa.Schema, window: Window) -> pa.Schema:
    """An input's columns with the window columns after them (see ``_windows``)."""
    check_time_column(view, alias, schema, window.time, "window")
    missing = [c for c in window.by if c not in schema.names]
    if missing:
        raise ProjectionDefinitionError(
            f"view {view}: the session window is by {', '.join(missing)}, which input {alias} "
            f"does not have; its columns are {', '.join(schema.names)}")
    clash = [n for n in (WINDOW_START, WINDOW_END) if n in schema.names]
    if clash:
        raise ProjectionDefinitionError(
            f"view {view}: input {alias} already has a column {clash[0]!r}, which the window "
            "adds; rename that column")
    return schema.append(pa.field(WINDOW_START, TIME_TYPE)).append(
        pa.field(WINDOW_END, TIME_TYPE))


@dataclass(frozen=True)
class FeedRead:
    """What ``EventFeed.read`` found: the feed rows of the events read (without window
    columns), the rows of deleted streams to delete, the newest event's time, the position
    after them, the feed's largest event time and replays folded so far, before them."""

    rows: pa.Table
    deletes: pa.Table
    moment: datetime
    end: int
    max_time: int | None
    replayed: int
    #: The streams whose deletion records were read.
    deleted: frozenset[str] = frozenset()
    #: The first global position read.
    start: int = 1
    #: The times of events deleted since that were read before, in the range read
    #: (``_deleted_events``).
    deleted_times: DeletedTimes | None = None


@dataclass(frozen=True)
class FeedBatch:
    """What ``EventFeed.advance`` fed: rows appended, the window starts they fell in (of a
    windowed feed, in microseconds), the feed's largest event time after it, and of a
    session window each session's end by its start."""

    appended: int
    windows: frozenset[int] = frozenset()
    max_event_time: int | None = None
    ends: Mapping[int, int] = field(default_factory=dict)
    #: True when the batch moved the largest event time (windows may close without a row
    #: written: the events or changes that moved it were late).
    watermark_moved: bool = False
    #: The newest event's recording time (the time of the rows the batch gives).
    moment: datetime | None = None
    #: The feed's largest event time before the batch.
    max_event_time_before: int | None = None


class Feed(Protocol):
    """What the maintainer drives each of a view's feeds through (``EventFeed``: an event
    input; ``ChangelogWindowFeed``: a captured table's windowed input): created with the
    view's generation, advanced in the batch's transaction, dropped with it."""

    alias: str
    #: The feed's derived stream (its rows are the view's input of that name).
    name: str
    stream: DerivedStream
    schema: pa.Schema

    def create(self, conn: psycopg.Connection[Any]) -> None: ...

    def drop(self, conn: psycopg.Connection[Any]) -> None: ...

    def position(self, conn: psycopg.Connection[Any]) -> int: ...

    def advance(self, conn: psycopg.Connection[Any], state: LatestRows | None, head: int
                ) -> FeedBatch: ...

    def readers(self) -> tuple[str, ...]:
        """The durable readers the feed holds on other streams (released on retire)."""
        ...


class EventFeed:
    """One event input of one view generation, fed into its derived stream."""

    def __init__(self, store_dsn: str, *, view: str, generation: int, alias: str,
                 source: EventInput, registry: EventRegistry | None,
                 window: Window | None = None, limit: int = 1_000_000,
                 live_generation: int | None = None) -> None:
        self.dsn = store_dsn
        self.view = view
        self.generation = generation
        self.alias = alias
        self.source = source
        self.name = feed_stream(view, generation, alias)
        self.stream = DerivedStream(self.name)
        self.decoder = payload_decoder(view, alias, source, registry)
        #: The most global positions one batch reads (a backlog is fed in several batches).
        self.limit = limit
        #: The window over this input's events (None: not windowed, one row per event).
        self.window = window
        #: An event's columns (with its lookups'); ``schema``: a feed row's (with the
        #: window's, if windowed).
        self.event_schema = event_schema(view, alias, self.decoder)
        fields = enrichment_fields(store_dsn, view, alias, source.lookups,
                                   self.event_schema) if source.lookups else []
        self.enricher = Enricher(view, alias, source.lookups, fields) if fields else None
        extra = [f for group in fields for f in group]
        self.event_schema = event_schema(view, alias, self.decoder, enrichment=extra)
        self.schema = event_schema(view, alias, self.decoder, window, extra)
        self._stream_schema: StreamSchema | None = None
        #: This batch's commit order of the events it feeds (lookups as of commit).
        self._order: CommitOrder | None = None
        #: Set when the feed's window rows are folded into the view's aggregates instead of
        #: written to its stream (``_window_aggregates``).
        self.folder: WindowAggregates | None = None
        #: Where the events' times are read, when they decide lateness (a window's; an
        #: interval join's, set by the view): the times of deleted events are kept for it.
        self.times: TimeSource | None = None if window is None else \
            TimeSource(view, alias, window.time, window.by)
        #: Of a generation being built while another is live: the live one's feed of this
        #: input, which this one never reads past (``_deleted_events``).
        self.sibling = None if live_generation is None or live_generation == generation \
            else feed_stream(view, live_generation, alias)
        #: Called with the streams a batch's deletion records name, before their rows are
        #: read from the state (an interval join restores the rows it had forgotten).
        self.on_deleted: Callable[[psycopg.Connection[Any], frozenset[str]], None] | None = \
            None

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the feed's stream and progress (idempotent)."""
        with conn.transaction():
            install_feeds(conn)
            conn.execute("INSERT INTO lakefold.event_feeds (stream) VALUES (%s) "
                         "ON CONFLICT DO NOTHING", (self.name,))
            if self.window is not None:
                install_late_events(conn)
            if self.window is not None or self.decoder is not None:
                install_dead_letters(conn)
        install_deleted_times(conn)
        if self.enricher is not None:
            self.enricher.create(conn)
        keys = ["position"] if self.window is None else ["position", WINDOW_START]
        self._stream_schema = self.stream.create(conn, self.schema, keys)

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Forget the feed's progress (``self.stream.drop`` deletes its stream)."""
        with conn.transaction():
            install_feeds(conn)
            conn.execute("DELETE FROM lakefold.event_feeds WHERE stream = %s", (self.name,))

    def position(self, conn: psycopg.Connection[Any]) -> int:
        """The next global position the feed reads (1: nothing fed yet)."""
        return feed_position(conn, self.name)

    def readers(self) -> tuple[str, ...]:
        """None: the feed reads the event store, which has no durable readers."""
        return ()

    def advance(self, conn: psycopg.Connection[Any], state: LatestRows | None, head: int
                ) -> FeedBatch:
        """Feed the events after the feed's position up to ``head`` (the store's head, read
        before the caller's transaction began; at most ``limit`` positions), in the caller's
        transaction; ``state`` is the view's state of this feed (to find the rows of a
        deleted stream; None when the feed folds its rows). A windowed feed also folds in
        the late events replayed since its last batch."""
        read = self.read(conn, state, head)
        rows, windows, max_time = read.rows, frozenset[int](), read.max_time
        ghosts = read.deleted_times
        if self.window is not None and rows.num_rows == 0:  # in no window: none added
            rows = self.schema.empty_table()
            if ghosts is not None and ghosts.top is not None:  # deleted since: they moved it
                max_time = ghosts.top if max_time is None else max(max_time, ghosts.top)
        if self.window is not None and self.window.kind == "session":
            if rows.num_rows:
                assert state is not None  # noqa: S101 - sessions move their rows, kept there
                return self._sessions(conn, state, read)
            return self.write(conn, read, rows, max_time)
        if self.window is not None and rows.num_rows:
            rows, windows, max_time = self._windowed(conn, rows, max_time, ghosts)
        batch = self.write(conn, read, rows, max_time, windows)
        if self.window is not None:
            batch = self._fold_replays(conn, batch, read.replayed, read.start)
        return batch

    def read(self, conn: psycopg.Connection[Any], state: LatestRows | None, head: int
             ) -> FeedRead:
        """The feed's rows of the events after its position up to ``head`` (see
        ``advance``), not written yet; events whose payload the models cannot read are
        dead-lettered."""
        start, max_time, replayed, mark_lsn, mark_head = conn.execute(
            "SELECT next_position, max_event_time, replayed_through, mark_lsn, mark_head "
            "FROM lakefold.event_feeds WHERE stream = %s FOR UPDATE",
            (self.name,)).fetchone()  # type: ignore[misc]
        head = min(head, int(start) + self.limit - 1)
        if self.sibling is not None and self.times is not None:  # lateness decided here
            head = self._behind_live(conn, int(start), head)
        end = max(int(start), head + 1)
        if self.enricher is not None and self.enricher.by_commit:
            end = self._commit_gate(conn, int(start), head, mark_lsn, mark_head)
        # Final below the head, so read on a connection of its own (sealed segments, binary
        # COPY): a stream deleted meanwhile shows as its deletion record in a later batch.
        events = pa.Table.from_batches(list(read_events_range(
            self.dsn, int(start), end, category=self.source.category,
            types=self.source.types or None)), schema=EVENTS_ARROW_SCHEMA)
        top = None if max_time is None else int(max_time)
        ghosts = None if self.times is None else \
            in_range(conn, self.times, int(start), end)
        if events.num_rows == 0:
            empty = self.event_schema.empty_table()
            return FeedRead(empty, self.schema.empty_table(), datetime.now(UTC), end, top,
                            int(replayed), start=int(start), deleted_times=ghosts)
        deletion = pc.equal(events.column("type"), STREAM_DELETED_TYPE)
        deleted = _deleted_streams(events.filter(deletion))
        if deleted and self.on_deleted is not None:
            self.on_deleted(conn, frozenset(deleted))
        deletes = self.schema.empty_table() if state is None or not deleted else \
            self._deleted_rows(conn, state, deleted)
        if deleted:
            self._forget_deleted(conn, deletes, deleted)
        events = events.filter(pc.invert(deletion))
        if deleted:  # events of a deleted stream read in this very range
            gone = pc.is_in(events.column("stream_id"), pa.array(sorted(deleted), pa.string()))
            events = events.filter(pc.invert(gone))
        try:
            rows = self._rows(conn, events, self._order)
        except SparkTerminalError:  # payloads that do not fit the registered models
            events = self._without_undecodable(conn, events)
            rows = self._rows(conn, events, self._order)
        newest = pc.max(events.column("recorded_at")).as_py() if events.num_rows else \
            datetime.now(UTC)
        return FeedRead(rows, deletes, newest, end, top, int(replayed), frozenset(deleted),
                        int(start), ghosts)

    def write(self, conn: psycopg.Connection[Any], read: FeedRead, rows: pa.Table,
              max_time: int | None, windows: frozenset[int] = frozenset(),
              moved: pa.Table | None = None, ends: Mapping[int, int] | None = None
              ) -> FeedBatch:
        """Append ``rows`` (of ``read``, as the feed keeps them), ``read``'s deletes and the
        rows ``moved`` out of their window (a session's), and move the feed's position past
        ``read``, with ``max_time`` its largest event time."""
        deletes = read.deletes if moved is None or not moved.num_rows else \
            pa.concat_tables([read.deletes, moved.cast(read.deletes.schema)])
        appended = self._write(conn, rows, deletes, read.moment, read.deleted) \
            if rows.num_rows or deletes.num_rows or read.deleted else 0
        conn.execute("UPDATE lakefold.event_feeds SET next_position = %s, max_event_time = %s "
                     "WHERE stream = %s", (read.end, max_time, self.name))
        return FeedBatch(appended, windows, max_time, dict(ends or {}),
                         max_time != read.max_time, read.moment, read.max_time)

    def _behind_live(self, conn: psycopg.Connection[Any], start: int, head: int) -> int:
        """The last position a generation being built may read: never past the live
        generation's feed, and nothing while the live one has a deletion still to read (the
        times of the events it deletes are recorded when the live one reads it)."""
        assert self.sibling is not None  # noqa: S101 - only for a generation being built
        row = conn.execute("SELECT next_position FROM lakefold.event_feeds WHERE stream = %s",
                           (self.sibling,)).fetchone()
        if row is None:
            return head  # the live generation does not read this input
        live = int(row[0])
        if live <= head:
            pending = pa.Table.from_batches(list(read_events_range(
                self.dsn, live, head + 1, category=self.source.category,
                types=[STREAM_DELETED_TYPE])), schema=EVENTS_ARROW_SCHEMA)
            if pc.any(pc.equal(pending.column("type"), STREAM_DELETED_TYPE)).as_py():
                return start - 1
        return min(head, live - 1)

    def _forget_deleted(self, conn: psycopg.Connection[Any], rows: pa.Table,
                        streams: Collection[str]) -> None:
        """A batch read the deletion of ``streams``: keep the times of their events it had
        fed (``rows``, of the view's state; of a folded feed, the folder keeps them), and take
        their late events off this generation's list."""
        source = self.times
        if source is None:  # lateness is not decided here: nothing listed, no time needed
            return
        forget_late_streams(conn, self.view, self.generation, self.alias, sorted(streams))
        if self.folder is not None:  # no rows: the folder has them
            record(conn, source, *self.folder.times_of(conn, streams))
        if not rows.num_rows:
            return
        rows = _first_per_position(rows)  # a windowed feed has a row per event and window
        times, missing = event_times(rows.column(source.column))
        keep = ~missing
        keys = None
        if source.by:
            values = [rows.column(c).to_pylist() for c in source.by]
            keys = [k for k, ok in zip(zip(*values, strict=True), keep, strict=True) if ok]
        record(conn, source, rows.column("position").to_numpy()[keep].tolist(),
               times[keep].tolist(), keys)

    def _sessions(self, conn: psycopg.Connection[Any], state: LatestRows,
                  read: FeedRead) -> FeedBatch:
        """Feed a session-windowed batch (``_session_windows``): the events' rows in their
        sessions, the earlier rows of sessions that moved deleted and written again, the late
        events recorded, those without a time dead-lettered."""
        window, source = self.window, self.times
        assert window is not None and source is not None  # noqa: S101 - a session window
        rows = read.rows
        times, missing = event_times(rows.column(window.time))
        if missing.any():
            self.dead_letter_times(conn, rows.filter(pa.array(missing)), window.time)
        keys = [_key_text(k) for k in zip(*(rows.column(c).to_pylist() for c in window.by),
                                          strict=True)]
        earlier = self._session_rows(conn, state, set(keys))
        # the events deleted since that shaped these sessions: before the batch and in it
        held = {p for _, p, _, _, _, _ in earlier}
        before = of_keys(conn, source, [tuple(json.loads(k)) for k in set(keys)], read.start)
        deleted = [(_key_text(k), int(t)) for p, t, k in zip(
            before.positions, before.times, before.keys, strict=True) if int(p) not in held]
        ghosts = read.deleted_times
        positions = rows.column("position").to_numpy()
        order, all_keys, all_times, all_missing, phantom = _with_ghosts(
            positions, keys, times, missing, ghosts)
        found = assign_sessions(
            window.size_us, window.lateness_us, all_keys, all_times, all_missing,
            [(k, p, t, s, e) for k, p, t, s, e, _ in earlier], read.max_time, deleted,
            phantom)
        index = order  # batch entry → row index (-1: a deleted event)
        if found.late:
            late = np.array([index[i] for i, _, _, _ in found.late], dtype=np.int64)
            starts = np.array([s for _, _, s, _ in found.late], dtype=np.int64)
            ends = np.array([e for _, _, _, e in found.late], dtype=np.int64)
            record_late(conn, self.view, self.generation, self.alias, positions[late], starts,
                        ends - starts, times[late],
                        np.array([w for _, w, _, _ in found.late], np.int64), kind="session",
                        streams=rows.column("stream_id").take(pa.array(late)).to_pylist())
        found = replace(found, new_rows=[(int(index[i]), s, e) for i, s, e in found.new_rows])
        take = np.array([i for i, _, _ in found.new_rows], dtype=np.int64)
        fresh = self._window_rows(rows, take, np.array([s for _, s, _ in found.new_rows],
                                                       dtype=np.int64),
                                  np.array([e for _, _, e in found.new_rows], dtype=np.int64))
        by_position = {p: row for _, p, _, _, _, row in earlier}
        moved = [(by_position[p], old, new, end) for p, old, new, end in found.moved]
        gone = [row for row, old, new, _ in moved if old != new]  # same start: an upsert
        again = [row | {WINDOW_START: moment(new), WINDOW_END: moment(end)}
                 for row, _, new, end in moved]
        out = pa.concat_tables([fresh, pa.Table.from_pylist(again, schema=self.schema)])
        by_start = {s: e for _, s, e in found.new_rows} | {n: e for _, _, n, e in found.moved}
        return self.write(conn, read, out, found.max_time, frozenset(by_start), moved=pa.Table
                          .from_pylist(gone, schema=self.schema), ends=by_start)

    def _session_rows(self, conn: psycopg.Connection[Any], state: LatestRows,
                      keys: set[str]) -> list[tuple[str, int, int, int, int, dict[str, Any]]]:
        """The fed rows of ``keys``' sessions (keys as ``_key_text``): (key, position, time,
        window start, window end, the row)."""
        window = self.window
        assert window is not None  # noqa: S101 - only for a session window
        first = self.schema.field(window.by[0])
        firsts = {json.loads(k)[0] for k in keys}
        values = pa.array(sorted({v for v in firsts if v is not None}, key=repr),
                          first.type)
        texts = text_array(column_for(first, key=False), values).to_pylist()
        if None in firsts:
            texts.append(None)
        typed = data_columns(state.typed(conn, state.rows_where(conn, first.name, texts)))
        if typed.num_rows == 0:
            return []
        typed = typed.select(self.schema.names).cast(self.schema)
        times, _ = event_times(typed.column(window.time))
        starts = pc.cast(typed.column(WINDOW_START), pa.int64()).to_pylist()
        ends = pc.cast(typed.column(WINDOW_END), pa.int64()).to_pylist()
        out = []
        for row, at, start, end in zip(typed.to_pylist(), times.tolist(), starts, ends,
                                       strict=True):
            key = _key_text(tuple(row[c] for c in window.by))
            if key in keys:
                out.append((key, int(row["position"]), at, int(start), int(end), row))
        return out

    def _commit_gate(self, conn: psycopg.Connection[Any], start: int, head: int,
                     mark_lsn: int | None, mark_head: int | None) -> int:
        """The end of the events to feed when lookups are as of commit: every event whose
        commit marker the captures stored, up to the first without one. Events without a
        marker are fed once the captures stored a WAL position marked after them at an
        earlier batch (recorded before the markers existed; a new mark then). Sets
        ``self._order``, the fed events' commit LSNs. See ``_lookups``."""
        assert self.enricher is not None  # noqa: S101 - only with lookups
        self.enricher.ensure_markers(conn)  # the event store may have come after the view
        order = self.enricher.commit_order(conn, start, head + 1)
        if mark_lsn is not None and mark_head is not None and \
                self.enricher.flushed(conn) >= mark_lsn:
            order = order.settle(int(mark_head) + 1)
            mark_lsn = None
        unknown = order.first_unknown()
        if unknown is not None and mark_lsn is None:
            conn.execute("UPDATE lakefold.event_feeds SET mark_lsn = %s, mark_head = %s "
                         "WHERE stream = %s", (wal_insert_lsn(conn), head, self.name))
        self._order = order
        return max(start, head + 1 if unknown is None else unknown)

    def _write(self, conn: psycopg.Connection[Any], rows: pa.Table, deletes: pa.Table,
               committed: datetime, deleted: Collection[str] = ()) -> int:
        """Append ``rows`` and ``deletes`` (the rows of the ``deleted`` streams) to the feed's
        stream, or fold ``rows`` in and the ``deleted`` streams out (``folder``)."""
        if self.folder is not None:
            return self.folder.fold(conn, rows, deleted)
        assert self._stream_schema is not None  # noqa: S101 - create() runs first
        old = pa.Table.from_pylist([{}] * rows.num_rows, schema=rows.schema)
        start, end = self.stream.append(conn, self._stream_schema, upserts=rows, old=old,
                                        deletes=deletes, commit_lsn=0, commit_ts=committed)
        return end - start

    def _windowed(self, conn: psycopg.Connection[Any], rows: pa.Table, max_time: int | None,
                  ghosts: DeletedTimes | None) -> tuple[pa.Table, frozenset[int], int | None]:
        """An event's row per window it counts in; its late (event, window) pairs recorded
        in the late events, unless replayed; events without a time dead-lettered; the times
        of events deleted since (``ghosts``) move the watermark where they were."""
        window = self.window
        assert window is not None  # noqa: S101 - only for a windowed feed
        times, missing = event_times(rows.column(window.time))
        positions = rows.column("position").to_numpy()
        found = classify(window, times, missing, max_time,
                         None if ghosts is None or ghosts.empty else
                         ghosts.prefix_max(positions), None if ghosts is None else ghosts.top)
        replayed = record_late(conn, self.view, self.generation, self.alias,
                               positions[found.late_rows], found.late_starts, window.size_us,
                               times[found.late_rows], found.late_watermarks,
                               streams=rows.column("stream_id").take(
                                   pa.array(found.late_rows, pa.int64())).to_pylist())
        take, starts = found.rows, found.starts
        if replayed:
            back = np.array([(int(positions[r]), int(s)) in replayed for r, s in zip(
                found.late_rows, found.late_starts, strict=True)], dtype=bool)
            take = np.concatenate([take, found.late_rows[back]])
            starts = np.concatenate([starts, found.late_starts[back]])
        if len(found.no_time):
            self.dead_letter_times(conn, rows.take(pa.array(found.no_time)), window.time)
        return (self._window_rows(rows, take, starts), frozenset(starts.tolist()),
                found.max_time)

    def _window_rows(self, rows: pa.Table, take: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray | None = None) -> pa.Table:
        assert self.window is not None  # noqa: S101 - only for a windowed feed
        out = rows.take(pa.array(take, pa.int64()))
        ends = starts + self.window.size_us if ends is None else ends
        return out.append_column(WINDOW_START, pa.array(starts, pa.int64()).cast(TIME_TYPE)) \
            .append_column(WINDOW_END, pa.array(ends, pa.int64()).cast(TIME_TYPE)) \
            .cast(self.schema)

    def dead_letter_times(self, conn: psycopg.Connection[Any], rows: pa.Table,
                          column: str) -> None:
        """Dead-letter the events ``rows`` whose time ``column`` is NULL or not a time."""
        install_dead_letters(conn)
        letters = []
        for row in rows.select([c for c in rows.column_names if c not in (
                WINDOW_START, WINDOW_END)]).to_pylist():
            value = row[column]
            why = "is NULL" if value is None else f"is {str(value)!r}, not a time"
            letters.append(self._letter(
                row, f"event {row['position']}'s time {self.alias}.{column} {why}; it is in "
                "no window or join. Append a corrected event (a new version with an upcaster "
                "fixes old ones), then drop this letter"))
        add_dead_letters(conn, self.view, self.generation, letters)

    def _letter(self, row: dict[str, Any], why: str) -> NewDeadLetter:
        """A dead letter of this view for the event ``row`` (its values as JSON allows)."""
        return NewDeadLetter(
            ref=f"event:{self.alias}:{row['position']}", stage="view", source=self.alias,
            position=int(row["position"]),
            record={k: v if isinstance(v, int | float | bool | None) else str(v)
                    for k, v in row.items()},
            error=f"view {self.view}: {why}", attempts=1)

    def _without_undecodable(self, conn: psycopg.Connection[Any], events: pa.Table
                             ) -> pa.Table:
        """``events`` without those whose payload the registry's models cannot type, which
        go to the dead letters with the reason (found by halving the batch)."""
        decoder = self.decoder
        assert decoder is not None  # noqa: S101 - only a decoder raises it
        bad: list[tuple[int, str]] = []

        def search(start: int, length: int) -> None:
            part = events.slice(start, length)
            try:
                types, data = (part.column(c).combine_chunks() for c in ("type", "data"))
                decoded = decoder.decode(types, part.column("schema_version").combine_chunks(),
                                         data)
                decoder.check_required(types, decoded, data)
            except SparkTerminalError as e:
                if length == 1:
                    bad.append((start, str(e)))
                    return
                half = length // 2
                search(start, half)
                search(start + half, length - half)

        search(0, events.num_rows)
        letters = []
        for index, error in bad:
            event = events.slice(index, 1).to_pylist()[0]
            letters.append(self._letter(
                event, f"event {event['position']} ({event['type']} version "
                f"{event['schema_version']} of stream {event['stream_id']}): {error}; it is "
                "left out of the view. Register a model (or an upcaster) that reads it, or "
                "append a corrected event, then drop this letter"))
        add_dead_letters(conn, self.view, self.generation, letters)
        keep = np.ones(events.num_rows, dtype=bool)
        keep[[index for index, _ in bad]] = False
        return events.filter(pa.array(keep))

    def _fold_replays(self, conn: psycopg.Connection[Any], batch: FeedBatch,
                      replayed_through: int, start: int) -> FeedBatch:
        """Append the window rows of late events replayed since the feed's last batch that
        it read before ``start`` (the batch's first position: ``_windowed`` counts the
        replayed events it reads, in this batch or a later one)."""
        pairs, through = pending_replays(conn, self.view, self.generation, self.alias,
                                         replayed_through)
        if through != replayed_through:
            conn.execute("UPDATE lakefold.event_feeds SET replayed_through = %s "
                         "WHERE stream = %s", (through, self.name))
        wanted: dict[int, list[int]] = {}
        for position, window_start in pairs:
            if position < start:
                wanted.setdefault(position, []).append(window_start)
        if not wanted:
            return batch
        parts = [pa.Table.from_batches(list(read_events_range(
            self.dsn, p, p + 1, category=self.source.category,
            types=self.source.types or None)), schema=EVENTS_ARROW_SCHEMA)
            for p in sorted(wanted)]
        events = pa.concat_tables(parts)
        rows = self._rows(conn, events)
        positions = rows.column("position").to_pylist()
        take = [i for i, p in enumerate(positions) for _ in wanted[p]]
        starts = [s for p in positions for s in wanted[p]]
        out = self._window_rows(rows, np.array(take, dtype=np.int64),
                                np.array(starts, dtype=np.int64))
        newest = pc.max(events.column("recorded_at")).as_py() if events.num_rows else \
            datetime.now(UTC)
        appended = self._write(conn, out, self.schema.empty_table(), newest)
        return replace(batch, appended=batch.appended + appended,
                       windows=batch.windows | frozenset(starts))

    def _rows(self, conn: psycopg.Connection[Any], events: pa.Table,
              order: CommitOrder | None = None) -> pa.Table:
        """The feed's rows of ``events`` (see the module docstring), enriched by the
        input's lookups as of ``order`` (None: the events' commit LSNs as stored now, or 0;
        for late events replayed, fed before)."""
        base = events.select(list(EVENT_COLUMNS))
        if self.decoder is None:
            base = base.append_column("data", events.column("data")) \
                .append_column("metadata", events.column("metadata"))
        else:
            types = events.column("type").combine_chunks()
            data = events.column("data").combine_chunks()
            payload = self.decoder.decode(types, events.column("schema_version")
                                          .combine_chunks(), data)
            self.decoder.check_required(types, payload, data)
            for index, field in enumerate(self.decoder.schema):
                base = base.append_column(field.name, payload.field(index))
        if self.enricher is not None:
            if order is None and self.enricher.by_commit and base.num_rows:
                positions = base.column("position")
                order = self.enricher.commit_order(conn, int(pc.min(positions).as_py()),
                                                   int(pc.max(positions).as_py()) + 1)
            base = self.enricher.enrich(conn, base, order)
        return base.cast(self.event_schema)

    def _deleted_rows(self, conn: psycopg.Connection[Any], state: LatestRows,
                      streams: Collection[str]) -> pa.Table:
        """The fed rows of the ``streams`` (deleted)."""
        raw = state.rows_where(conn, "stream_id", streams)
        return data_columns(state.typed(conn, raw)).cast(self.schema)


def _key_text(values: tuple[Any, ...]) -> str:
    """A session's key (its ``by`` values) as text, as ``_deleted_events`` keeps it."""
    return json.dumps(list(values), default=str)


def _with_ghosts(positions: np.ndarray, keys: list[str], times: np.ndarray, missing: np.ndarray,
                 ghosts: DeletedTimes | None
                 ) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """A batch's events with the deleted events among them, in log order: for each entry
    the row index (-1 for a deleted event), key, time, no time, deleted."""
    if ghosts is None or ghosts.empty:
        return (np.arange(len(keys)), keys, times, missing,
                np.zeros(len(keys), dtype=bool))
    at = np.concatenate([positions, ghosts.positions])
    order = np.argsort(at, kind="stable")
    index = np.concatenate([np.arange(len(keys)), np.full(len(ghosts.positions), -1)])
    all_keys = keys + [_key_text(k) for k in ghosts.keys]
    return (index[order], [all_keys[i] for i in order],
            np.concatenate([times, ghosts.times])[order],
            np.concatenate([missing, np.zeros(len(ghosts.positions), dtype=bool)])[order],
            np.concatenate([np.zeros(len(keys), dtype=bool),
                            np.ones(len(ghosts.positions), dtype=bool)])[order])


def _first_per_position(rows: pa.Table) -> pa.Table:
    positions = rows.column("position").to_numpy()
    _, first = np.unique(positions, return_index=True)
    return rows.take(pa.array(np.sort(first), pa.int64()))


def _deleted_streams(records: pa.Table) -> set[str]:
    """The streams whose deletion records are ``records``."""
    return {json.loads(d).get("stream_id") or s for d, s in zip(
        records.column("data").to_pylist(), records.column("stream_id").to_pylist(),
        strict=True)}


def feed_position(conn: psycopg.Connection[Any], stream: str) -> int:
    """The next global position the feed ``stream`` reads (1: nothing fed yet)."""
    row = conn.execute("SELECT next_position FROM lakefold.event_feeds WHERE stream = %s",
                       (stream,)).fetchone()
    return 1 if row is None else int(row[0])


def store_head(store_dsn: str, conn: psycopg.Connection[Any] | None = None) -> int:
    """The event store's head (0 when it holds nothing or is not installed); on ``conn`` when
    given (see ``head_position``)."""
    from lakefold.eventstore import EventStoreNotInstalledError

    try:
        return head_position(store_dsn, conn)
    except EventStoreNotInstalledError:
        return 0
