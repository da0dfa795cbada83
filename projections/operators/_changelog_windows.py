"""Windows over a captured table's time column: ``tumbling("orders.placed_at", "1 minute")``
where ``orders`` is ``changelog("shop.orders")``.

The view's windowed input is a *feed* of the table's changes, as for events
(``_view_events``): a derived stream (``lakefold_feeds.<view>_g<N>_<input>``) holding each row
once per window its time falls in, keyed by the table's key and ``window_start``. An insert adds
the row to its windows; an update moves it (deleted from the windows it left, written in those
it is in); a delete takes it out; a ``TRUNCATE`` empties the feed. So the query groups by
``window_start`` over the table's rows like over events, and a change corrects its windows.

**Lateness, by the log**: the watermark before a change is the largest time among the rows
written before it in commit order (its own included) minus the allowed lateness. A change that
would alter a window the watermark has passed (the windows of the row it replaces, or of the row
it writes) is *late*: it is listed (``lakefold late list``, with the change's position in the
table's stream) and not applied, so final windows stay as they were written; the feed keeps the
row's earlier version until a later change of that row that is not late. A late change cannot
be replayed (the row may have changed since); a rebuild with a larger lateness applies it. A
``TRUNCATE`` is always applied (the rows are gone from the table). A row whose time is NULL, or
text that is not a time, is in no window: it goes to the dead letters with the reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from lakefold.projections.definitions._windows import (
    WINDOW_END,
    WINDOW_START,
    Window,
    event_times,
    moment,
)
from lakefold.projections.operators._view_events import (
    FeedBatch,
    feed_position,
    feed_stream,
    install_feeds,
    windowed_schema,
)
from lakefold.projections.state._deadletters import (
    NewDeadLetter,
    add_dead_letters,
    install_dead_letters,
)
from lakefold.projections.state._late_events import install_late_events, record_late
from lakefold.projections.state._stream_state import LatestRows, stage_records
from lakefold.store.internals import (
    ChangelogStore,
    DerivedStream,
    StreamSchema,
    column_for,
    copy_records,
    data_columns,
    row_schema,
    stream_meta,
    text_array,
    typed,
)

Row = dict[str, Any]



class ChangelogWindowFeed:
    """A captured table's changes, fed into a windowed input of one view generation."""

    def __init__(self, store: ChangelogStore, *, view: str, generation: int, alias: str,
                 table: str, window: Window, owner: str, limit: int = 1_000_000) -> None:
        self.store = store
        self.view = view
        self.generation = generation
        self.alias = alias
        self.window: Window = window
        #: The captured table's stream the feed reads (its durable reader is ``owner``).
        self.source_stream = table
        self.owner = owner
        self.limit = limit
        self.name = feed_stream(view, generation, alias)
        self.stream = DerivedStream(self.name)
        conn = store.connection()
        meta = stream_meta(conn, table)
        assert meta.latest is not None  # noqa: S101 - checked when the view was planned
        self.keys = [c.name for c in meta.latest.columns if c.key]
        source = row_schema(store, table)
        self.schema = windowed_schema(view, alias, source, window)
        self._stream_schema: StreamSchema | None = None

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the feed's stream and progress, and its reader of the table (idempotent)."""
        with conn.transaction():
            install_feeds(conn)
            conn.execute("INSERT INTO lakefold.event_feeds (stream) VALUES (%s) "
                         "ON CONFLICT DO NOTHING", (self.name,))
        install_late_events(conn)
        install_dead_letters(conn)
        self._stream_schema = self.stream.create(conn, self.schema, [*self.keys, WINDOW_START])
        self.store.commit_reader(self.owner, self.source_stream, self.position(conn) - 1)

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Forget the feed's progress (``self.stream.drop`` deletes its stream)."""
        with conn.transaction():
            conn.execute("DELETE FROM lakefold.event_feeds WHERE stream = %s", (self.name,))

    def position(self, conn: psycopg.Connection[Any]) -> int:
        """The next position of the table's stream the feed reads (1: nothing yet)."""
        return feed_position(conn, self.name)

    def readers(self) -> tuple[str, ...]:
        """The durable reader the feed holds on the table's stream (released on retire)."""
        return (self.owner,)

    def advance(self, conn: psycopg.Connection[Any], state: LatestRows | None, head: int
                ) -> FeedBatch:
        """Feed the table's changes after the feed's position (at most ``limit``), in the
        caller's transaction (see the module docstring); ``state``: the view's state of the
        feed (the rows it holds); ``head`` (the event store's) does not bound a table's feed."""
        assert self._stream_schema is not None  # noqa: S101 - create() runs first
        assert state is not None  # noqa: S101 - a table's feed is never folded
        start, top = conn.execute(
            "SELECT next_position, max_event_time FROM lakefold.event_feeds WHERE stream = %s "
            "FOR UPDATE", (self.name,)).fetchone()  # type: ignore[misc]
        changes = self._changes(conn, int(start))
        if changes.num_rows == 0:
            return FeedBatch(0, max_event_time=None if top is None else int(top))
        end = int(pc.max(changes.column("_position")).as_py()) + 1
        held = self._held(conn, state, changes)
        final: dict[tuple[Any, ...], Row | None] = {}
        touched: set[int] = set()
        max_time = None if top is None else int(top)
        late: list[tuple[int, int, int, int]] = []  # position, window start, time, watermark
        letters: list[NewDeadLetter] = []
        window = self.window
        times, missing = event_times(changes.column(window.time))
        data = data_columns(changes).select([c for c in self.schema.names
                                      if c not in (WINDOW_START, WINDOW_END)]).to_pylist()
        ops = changes.column("_op").to_pylist()
        positions = changes.column("_position").to_pylist()
        for row, op, position, at, gone in zip(data, ops, positions, times.tolist(),
                                                missing.tolist(), strict=True):
            if op == "truncate":
                for key, rows in held.items():
                    for start_us in rows:
                        final[(*key, start_us)] = None
                        touched.add(start_us)
                held = {}
                continue
            key = tuple(row[k] for k in self.keys)
            old = held.get(key, {})
            new: dict[int, Row] = {}
            if op == "delete":  # a delete carries the key only: its time is the row held
                at, gone = self._time_of(old)
            if op != "delete" and not gone:
                max_time = at if max_time is None else max(max_time, at)
                _, starts = window.assign(np.array([at], dtype=np.int64))
                new = {int(s): row for s in starts.tolist()}
            if new and set(new) == set(old) and all(r == row for r in old.values()):
                continue  # an update that changed nothing the feed holds
            watermark = None if max_time is None else max_time - window.lateness_us
            closed = [s for s in (*old, *new) if watermark is not None and
                      s + window.size_us <= watermark]
            if closed:
                assert watermark is not None  # noqa: S101 - closed needs a watermark
                late += [(position, s, at if not gone else s, watermark) for s in closed]
                continue
            if op != "delete" and gone:
                letters.append(self._letter(row, position))
            for start_us in old:
                if start_us not in new:
                    final[(*key, start_us)] = None
            for start_us, written in new.items():
                final[(*key, start_us)] = written
            touched |= set(old) | set(new)
            held[key] = new
        if late:
            array = np.array(late, dtype=np.int64)
            record_late(conn, self.view, self.generation, self.alias, array[:, 0], array[:, 1],
                        window.size_us, array[:, 2], array[:, 3], kind="change")
        if letters:
            add_dead_letters(conn, self.view, self.generation, letters)
        appended = self._write(conn, final, changes)
        conn.execute("UPDATE lakefold.event_feeds SET next_position = %s, max_event_time = %s "
                     "WHERE stream = %s", (end, max_time, self.name))
        self.store.commit_reader(self.owner, self.source_stream, end - 1)
        return FeedBatch(appended, frozenset(touched), max_time,
                         watermark_moved=max_time != (None if top is None else int(top)))

    def _time_of(self, rows: dict[int, Row]) -> tuple[int, bool]:
        """The time of the row held in ``rows`` (any of its windows), and whether it has
        none."""
        if not rows:
            return 0, True
        times, missing = event_times(pa.array([next(iter(rows.values()))[self.window.time]],
                                              self.schema.field(self.window.time).type))
        return int(times[0]), bool(missing[0])

    def _changes(self, conn: psycopg.Connection[Any], start: int) -> pa.Table:
        """The table's records from ``start`` (at most ``limit``), typed, read in the
        caller's transaction."""
        meta = stream_meta(conn, self.source_stream)
        end = min(meta.info.head + 1, start + self.limit)
        if end <= start:
            return typed(copy_records(conn, meta, sql.SQL(
                "SELECT c.*, c.after AS v FROM lakefold.changelog c WHERE false")), meta)
        staged = stage_records(conn, meta, start, end)
        try:
            return typed(copy_records(conn, meta, sql.SQL(
                "SELECT s.*, s.after AS v FROM {} s").format(staged)), meta)
        finally:
            conn.execute(sql.SQL("DELETE FROM {}").format(staged))

    def _held(self, conn: psycopg.Connection[Any], state: LatestRows, changes: pa.Table
              ) -> dict[tuple[Any, ...], dict[int, Row]]:
        """The rows the feed holds of the changed keys: key → window start → row (of a
        ``TRUNCATE`` in the batch: every row)."""
        if "truncate" in changes.column("_op").to_pylist():
            raw = state.rows(conn)
        else:
            first = self.schema.field(self.keys[0])
            values = pc.unique(pc.cast(changes.column(first.name), first.type))
            texts = text_array(column_for(first, key=True), values).to_pylist()
            raw = state.rows_where(conn, first.name, texts)
        rows = data_columns(state.typed(conn, raw))
        if rows.num_rows == 0:
            return {}
        rows = rows.select(self.schema.names).cast(self.schema)
        starts = pc.cast(rows.column(WINDOW_START), pa.int64()).to_pylist()
        held: dict[tuple[Any, ...], dict[int, Row]] = {}
        for row, start in zip(rows.drop_columns([WINDOW_START, WINDOW_END]).to_pylist(),
                              starts, strict=True):
            held.setdefault(tuple(row[k] for k in self.keys), {})[int(start)] = row
        return held

    def _write(self, conn: psycopg.Connection[Any], final: dict[tuple[Any, ...], Row | None],
               changes: pa.Table) -> int:
        assert self._stream_schema is not None  # noqa: S101 - create() runs first
        size = self.window.size_us
        upserts = [row | {WINDOW_START: moment(k[-1]), WINDOW_END: moment(k[-1] + size)}
                   for k, row in final.items() if row is not None]
        deletes = [dict(zip(self.keys, k[:-1], strict=True)) | {WINDOW_START: moment(k[-1])}
                   for k, row in final.items() if row is None]
        if not upserts and not deletes:
            return 0
        committed = pc.max(changes.column("_commit_ts")).as_py()  # the newest change's commit
        schema = self.schema
        table = pa.Table.from_pylist(upserts, schema=schema)
        start, end = self.stream.append(
            conn, self._stream_schema, upserts=table,
            old=pa.Table.from_pylist([{}] * len(upserts), schema=schema),
            deletes=pa.Table.from_pylist(deletes, schema=schema), commit_lsn=0,
            commit_ts=committed)
        return end - start

    def _letter(self, row: Row, position: int) -> NewDeadLetter:
        column = self.window.time
        value = row.get(column)
        why = "is NULL" if value is None else f"is {str(value)!r}, not a time"
        return NewDeadLetter(
            ref=f"change:{self.alias}:{position}", stage="view", source=self.alias,
            position=position,
            record={k: v if isinstance(v, int | float | bool | None) else str(v)
                    for k, v in row.items()},
            error=f"view {self.view}: the row of {self.source_stream} at position {position}: "
            f"its time {column} {why}; it is in no window. Give the row a time; its next "
            "change is fed, then drop this letter", attempts=1)
