"""One generation of a view, kept up to date: a batch at a time, in one store transaction.

A view reads changelog streams (captured tables, or other views' output streams) and writes
its output rows as a derived stream of its own (``capture.store._derived_streams``), which
targets and downstream views read like any captured table. Per input it keeps a *state*, the
input's latest row per key (``capture.store._stream_state``); it keeps one of its own output
too, to know the rows a recomputed partition replaces.

One batch (``step``), in ONE store transaction:

1. **Cut**: the heads of every input, read in one statement. The capture moves the heads of a
   source transaction's streams in one store transaction, so a cut never holds half of a source
   transaction: a view joining two tables changed together sees both changes or neither.
2. **Apply** each input's records up to the cut to its state, keeping the before- and
   after-images of every changed row.
3. **Affected partitions** (see ``_view_plan``): for a direct input, the partition values of
   its images; for a lookup input, those of the rows its images join, looked up in the state of
   the input it is joined to (already at the cut).
4. **Recompute** those partitions: their rows of each input, typed as a changelog read types
   them, become Spark DataFrames named as the view names its inputs; the user's query runs
   over them. A truncate of an input, and the first batch, recompute everything.
5. **Diff** against the view's own state: rows that changed are upserts, rows of a recomputed
   partition that are gone are deletes, unchanged rows are not written at all.
6. **Append** the upserts and deletes to the output stream and apply them to the view's own
   state.

The commit makes the batch's effect and its progress (the states' positions) durable
together: a crash anywhere rolls the whole batch back, and the next ``step`` does it again.
Nothing else is needed for exactly-once: targets read the output stream with their own
checkpoints, as they read a captured table.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core.wal import format_lsn
from lakefold.projections.definitions._view_api import Query
from lakefold.projections.definitions._view_inputs import EventInput
from lakefold.projections.definitions._windows import (
    TIME_TYPE,
    WINDOW_END,
    WINDOW_FINAL,
    WINDOW_START,
    Window,
    event_times,
)
from lakefold.projections.exceptions import MissingKeyError, ProjectionStateError
from lakefold.projections.operators._changelog_windows import ChangelogWindowFeed
from lakefold.projections.operators._view_aggregates import GROUP_KEY, AggregateState
from lakefold.projections.operators._view_events import EventFeed, Feed, FeedBatch, store_head
from lakefold.projections.operators._window_aggregates import WindowAggregates
from lakefold.projections.plan._view_cuts import (
    Cut,
    choose_cut,
    forget_cuts,
    install_view_cuts,
    record_cut,
)
from lakefold.projections.plan._view_plan import Operator, ViewPlan, analyze, view_frame
from lakefold.projections.state._deadletters import install_dead_letters
from lakefold.projections.state._deleted_events import TimeSource
from lakefold.projections.state._late_events import (
    forget_late_generation,
    install_late_events,
    record_late,
)
from lakefold.projections.state._stream_state import StateChanges, StreamState
from lakefold.projections.state._window_book import (
    close_windows,
    forget_windows,
    install_window_book,
    open_windows,
)
from lakefold.schemas import EventRegistry
from lakefold.spark.internals import no_duplicate_error_logs
from lakefold.store.internals import (
    ChangelogStore,
    DerivedStream,
    column_for,
    commit_at,
    data_columns,
    row_schema,
    stream_meta,
    text_array,
    typed_array,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Advisory lock namespace: one maintainer per view generation.
LOCK_NAMESPACE = zlib.crc32(b"lakefold.view") & 0x7FFF_FFFF
Partition = tuple[str | None, ...]


#: The prefix of every view's output stream.
VIEW_STREAM_PREFIX = "lakefold_views."


def output_stream(view: str, generation: int) -> str:
    """The derived stream a generation of ``view`` writes."""
    return f"{VIEW_STREAM_PREFIX}{view}_g{generation}"


def view_owner(view: str, generation: int) -> str:
    """What a generation of ``view`` owns its input states and durable readers as."""
    return f"view:{view}@{generation}"


@dataclass(frozen=True)
class BatchResult:
    """What one batch did."""

    partitions: int | None  # None: everything was recomputed
    upserts: int
    deletes: int
    positions: tuple[int, int]
    #: Partitions the query failed on (partition column → text value; the error), left as
    #: they were.
    failed: tuple[tuple[dict[str, str | None], str], ...] = ()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _data_errors() -> tuple[type[BaseException], ...]:
    """Spark's errors about the data a query runs on (not about the query itself)."""
    from pyspark.errors import (
        ArithmeticException,
        DateTimeException,
        IllegalArgumentException,
        NumberFormatException,
        PythonException,
        SparkRuntimeException,
    )
    from pyspark.errors.exceptions.captured import ArrayIndexOutOfBoundsException

    return (ArithmeticException, DateTimeException, IllegalArgumentException,
            NumberFormatException, PythonException, SparkRuntimeException,
            ArrayIndexOutOfBoundsException)



class ViewMaintainer:
    """One generation of one view (see the module docstring)."""

    def __init__(self, spark: SparkSession, store_dsn: str, *, view: str, generation: int,
                 inputs: Mapping[str, str], query: Query, plan: ViewPlan,
                 events: Mapping[str, EventInput] | None = None,
                 registry: EventRegistry | None = None,
                 window: Window | None = None, feed_limit: int = 1_000_000,
                 live_generation: int | None = None) -> None:
        self.view = view
        self.generation = generation
        self.owner = view_owner(view, generation)
        self.dsn = store_dsn
        #: The view's window over event time (``_windows``), over one of its event inputs.
        self.window = window
        #: The view's join of two event inputs within a time bound (``_interval_joins``).
        self.join = plan.join
        self.store = ChangelogStore(store_dsn)
        #: Event inputs, each fed into a derived stream of this generation (``_view_events``),
        #: and a windowed table's changes (``_changelog_windows``).
        self.feeds: dict[str, Feed] = {
            alias: EventFeed(store_dsn, view=view, generation=generation, alias=alias,
                             source=source, registry=registry,
                             window=window if window and window.input == alias else None,
                             limit=feed_limit, live_generation=live_generation)
            for alias, source in (events or {}).items()}
        if window is not None and window.input in inputs:
            self.feeds[window.input] = ChangelogWindowFeed(
                self.store, view=view, generation=generation, alias=window.input,
                table=inputs[window.input], window=window, limit=feed_limit,
                # a reader of its own: the same table may also be a plain input of the view
                owner=f"{self.owner}:window:{window.input}")
        # name in the query → stream
        self.inputs = dict(inputs) | {alias: f.name for alias, f in self.feeds.items()}
        self.query = query
        self.plan = plan
        self.session = spark.newSession()
        #: The windowed event input whose rows fold into the view's aggregates (no input
        #: state, no Spark; ``_window_aggregates``), if the view is one such ``GROUP BY``.
        self.folded: WindowAggregates | None = None
        if plan.operator is Operator.WINDOW_FOLD:
            assert window is not None and plan.aggregate is not None  # noqa: S101 - the plan's
            fed = self.feeds[window.input]
            assert isinstance(fed, EventFeed)  # noqa: S101 - the planner folds event inputs
            self.folded = fed.folder = WindowAggregates(self.owner, plan.aggregate, fed.schema,
                                                        window.time)
        # Input name → its state. Names over one stream (a self-join written as two inputs of
        # one table or view) share one state, applied once a batch: each name then sees the
        # batch's images of that stream (``_apply_states``).
        shared: dict[str, StreamState] = {}
        self.states = {name: shared.setdefault(stream, StreamState(self.owner, stream))
                       for name, stream in self.inputs.items()
                       if self.folded is None or name != self.folded.plan.input}
        #: Of an interval join: each side's forgotten events, kept aside (``_restore``).
        self.archives: dict[str, StreamState] = {}
        if self.join is not None:
            for alias, column in ((self.join.left, self.join.left_time),
                                  (self.join.right, self.join.right_time)):
                feed = self.feeds[alias]
                assert isinstance(feed, EventFeed)  # noqa: S101 - joins are of events
                feed.times = TimeSource(view, alias, column)
                feed.on_deleted = self._restore
                self.archives[alias] = StreamState(f"{self.owner}:archive", self.inputs[alias])
        self.output = DerivedStream(output_stream(view, generation))
        self.own = StreamState(self.owner, self.output.name)
        self.aggregates: AggregateState | None = self.folded
        if plan.operator is Operator.KEPT_AGGREGATE:
            assert plan.aggregate is not None  # noqa: S101 - the plan keeps this aggregate
            self.aggregates = AggregateState(self.owner, plan.aggregate,
                                             self.states[plan.aggregate.input])
        self._schema: Any = None

    # ------------------------------------------------------------------ set-up

    def connection(self) -> psycopg.Connection[Any]:
        """The maintainer's store connection (reopened after a loss)."""
        return self.store.connection()

    def close(self) -> None:
        self.store.close()

    def install(self, output_schema: pa.Schema) -> None:
        """Create the input states (with an index per column they are looked up by), the
        output stream and the view's own state (idempotent)."""
        conn = self.connection()
        wanted = self.plan.lookup_columns()
        if self.feeds:
            self.store.install()  # a view over events only, where nothing was captured
        for feed in self.feeds.values():
            feed.create(conn)
        if self.window is not None:
            install_window_book(conn)
        if self.join is not None:
            install_late_events(conn)
            install_dead_letters(conn)
        for name, state in self.states.items():
            events = isinstance(self.feeds.get(name), EventFeed)
            lookups = (*wanted.get(name, ()), *(("stream_id",) if events else ()),
                       *(self.window.by if self.window and self.window.input == name else ()))
            state.create(conn, lookups)
            # A durable reader: compaction never drops a delete this view has not applied.
            self.store.commit_reader(self.owner, self.inputs[name], state.position(conn) - 1)
        install_view_cuts(conn)
        for alias, archive in self.archives.items():
            archive.create(conn, (*wanted.get(alias, ()), "stream_id"))
        self._schema = self.output.create(conn, output_schema, self.plan.key)
        self.own.create(conn, self.plan.partition)
        if self.aggregates is not None:
            self.aggregates.create(conn)

    def drop(self) -> None:
        """Delete what this generation keeps in the store: its input states, its own state,
        its aggregates, its event feeds and its output stream (nothing reads a retired
        generation's stream: the views that read it switched with it)."""
        conn = self.connection()
        for state in (*self.states.values(), *self.archives.values(), self.own):
            state.drop(conn)
        for feed in self.feeds.values():
            feed.drop(conn)
            feed.stream.drop(conn)
        self.output.drop(conn)
        with conn.transaction():
            forget_cuts(conn, self.output.name)
        if self.window is not None or self.join is not None:
            with conn.transaction():
                install_late_events(conn)
                forget_late_generation(conn, self.view, self.generation)
        if self.window is not None:
            forget_windows(conn, self.owner)
        if self.aggregates is not None:
            with conn.transaction():
                self.aggregates.drop(conn)

    # ------------------------------------------------------------------ one batch

    def step(self) -> BatchResult | None:
        """Apply everything up to the inputs' heads as one batch; None when nothing is new."""
        conn = self.connection()
        event_head = store_head(self.dsn) if any(  # final up to here
            isinstance(f, EventFeed) for f in self.feeds.values()) else 0
        if self.folded is not None:
            return self._fold_step(conn, self.folded, event_head)
        with conn.transaction():
            self._lock(conn)
            if self.join is not None:
                fed = self._feed_join(conn, event_head)
            else:
                fed = {alias: feed.advance(conn, self.states[alias], event_head)
                       for alias, feed in self.feeds.items()}
            watermark = self._watermark(fed)
            starts = {name: state.position(conn) for name, state in self.states.items()}
            cut = self._cut(conn, starts)
            heads = cut.heads
            if all(int(heads.get(self.inputs[n], 0)) + 1 <= starts[n] for n in self.inputs) \
                    and not any(f.watermark_moved for f in fed.values()):
                record_cut(conn, self.output.name, cut, self._head(conn), moved=False,
                           first_commit=None)
                return None
            changes = self._apply_states(conn, heads)
            for name, change in changes.items():  # compaction keeps what follows
                self.store.commit_reader(self.owner, self.inputs[name], change.end - 1)
            everything = self.plan.whole or all(s == 1 for s in starts.values()) or any(
                c.truncated for c in changes.values())
            affected = None if everything else self._affected(conn, changes)
            if self.window is not None:
                closing = self._close_windows(conn, fed[self.window.input], watermark,
                                              find=affected is not None)
                if affected is not None:
                    affected |= closing
            kept: pa.Table | None = None
            if self.join is not None:
                affected, kept = self._join_partitions(conn, affected, watermark)
            if affected is not None and not affected:
                if kept is not None:
                    self._forget(conn, kept, watermark)
                record_cut(conn, self.output.name, cut, self._head(conn), moved=False,
                           first_commit=None)
                return BatchResult(0, 0, 0, (0, 0))
            failed: dict[Partition, str] = {}
            if self.aggregates is not None:
                images = None if affected is None else changes[self.aggregates.plan.input]
                rows = self.aggregates.apply(conn, images, self._output_schema())
                computed = affected
            else:
                rows, failed, computed = self._recompute(conn, affected)
            rows = self._flag_final(rows, watermark)
            old = self._old_rows(conn, computed)
            upserts, previous, deletes = self._diff(old, rows)
            commit_lsn, commit_ts = self._commit_point(conn, changes)
            positions = self.output.append(conn, self._schema, upserts=upserts, old=previous,
                                           deletes=deletes, commit_lsn=commit_lsn,
                                           commit_ts=commit_ts)
            self.own.apply(conn, positions[1], images=False)
            moved = positions[1] > positions[0]
            record_cut(conn, self.output.name, cut, positions[1] - 1, moved=moved,
                       first_commit=self._first_commit(conn, changes) if moved else None)
            if kept is not None:
                self._forget(conn, kept, watermark)
        return BatchResult(None if affected is None else len(affected), upserts.num_rows,
                           deletes.num_rows, positions, self._named(failed))

    def _cut(self, conn: psycopg.Connection[Any], starts: Mapping[str, int]) -> Cut:
        """Where this batch reads each input up to (``_view_cuts``): the tables and the
        upstream views' outputs at one source commit; this generation's own feeds at their
        heads. When the upstream views have not reached this view's frontier yet, nothing of
        the tables or views is read (the feeds still move)."""
        heads = {str(n): int(h) for n, h in conn.execute(
            "SELECT name, head FROM lakefold.changelog_streams WHERE name = ANY(%s)",
            (list(self.inputs.values()),)).fetchall()}
        feeds = {f.name for f in self.feeds.values()}
        views = {s: h for s, h in heads.items() if s.startswith(VIEW_STREAM_PREFIX)}
        tables = {s: h for s, h in heads.items() if s not in feeds and s not in views}
        at = {self.inputs[name]: position for name, position in starts.items()}
        cut = choose_cut(conn, tables, views, self.output.name, at)
        if cut is None:  # wait: read nothing new of the tables and views
            return Cut({s: (at.get(s, 1) - 1 if s not in feeds else h)
                        for s, h in heads.items()})
        return Cut(cut.heads | {s: heads[s] for s in feeds if s in heads}, cut.slot,
                   cut.frontier)

    def _head(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT head FROM lakefold.changelog_streams WHERE name = %s",
                           (self.output.name,)).fetchone()
        return 0 if row is None else int(row[0])

    def _first_commit(self, conn: psycopg.Connection[Any],
                      changes: Mapping[str, StateChanges]) -> int | None:
        """The first source commit the batch applied (the view's previous output was exact
        up to it): of a table, its first record's; of an upstream view, the commit its own
        output stopped being exact at."""
        found: list[int] = []
        for name, change in changes.items():
            if change.end <= change.start:
                continue
            stream = self.inputs[name]
            if stream.startswith(VIEW_STREAM_PREFIX):
                row = conn.execute(
                    "SELECT valid_until FROM lakefold.view_cuts WHERE stream = %s AND "
                    "position < %s ORDER BY position DESC LIMIT 1",
                    (stream, change.start)).fetchone()
                if row is not None and row[0] is not None:
                    found.append(int(row[0]))
            else:
                lsn = commit_at(conn, stream, change.start)
                if lsn is not None:
                    found.append(lsn)
        return min(found, default=None)

    def _apply_states(self, conn: psycopg.Connection[Any], heads: Mapping[str, int]
                      ) -> dict[str, StateChanges]:
        """Apply each state up to its stream's head at the cut; every input name gets its
        stream's changes (names sharing a stream get the same, applied once)."""
        applied: dict[str, StateChanges] = {}
        for state in self.states.values():
            if state.stream not in applied:
                applied[state.stream] = state.apply(conn, int(heads.get(state.stream, 0)) + 1)
        return {name: applied[state.stream] for name, state in self.states.items()}

    def _lock(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                     (LOCK_NAMESPACE, zlib.crc32(self.owner.encode()) & 0x7FFF_FFFF))

    def _fold_step(self, conn: psycopg.Connection[Any], folded: WindowAggregates,
                   head: int) -> BatchResult | None:
        """``step`` of a view whose feed folds its window rows into the aggregates: the
        feed's batch folded, the windows the watermark passed read to write them final,
        the touched groups' rows after the fold diffed against theirs before it (the
        view's own state is not needed)."""
        window = self.window
        assert window is not None  # noqa: S101 - only a windowed feed folds
        feed = self.feeds[window.input]
        assert isinstance(feed, EventFeed)  # noqa: S101 - only an event feed folds
        with conn.transaction():
            self._lock(conn)
            fed = feed.advance(conn, None, head)
            if not fed.appended and not fed.watermark_moved:
                return None
            watermark = self._watermark({window.input: fed})
            open_windows(conn, self.owner, fed.windows, None)
            closed = [] if watermark is None else close_windows(
                conn, self.owner, watermark - window.size_us, by_end=False)
            output = self._output_schema()
            output = output.remove(output.get_field_index(WINDOW_FINAL))  # _flag_final's
            before, after = folded.finish(conn, closed, output)
            # The view's rows of these groups, as the last batch wrote them: after every batch
            # a group's row is its aggregates flagged final by that batch's watermark (each
            # batch writes the groups it touched and the windows it closed).
            earlier = fed.max_event_time_before
            old = self._flag_final(before, None if earlier is None else
                                   earlier - window.lateness_us)
            upserts, previous, deletes = self._diff_groups(old, self._flag_final(after,
                                                                                 watermark))
            positions = self.output.append(conn, self._schema, upserts=upserts, old=previous,
                                           deletes=deletes, commit_lsn=0,
                                           commit_ts=fed.moment or datetime.now(UTC))
        return BatchResult(after.num_rows, upserts.num_rows, deletes.num_rows, positions)

    def _diff_groups(self, old: pa.Table, new: pa.Table
                     ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """``_diff`` of rows that carry their group key (``GROUP_KEY``), column by column."""
        columns = [c.name for c in self._schema.columns]
        index = {k: i for i, k in enumerate(old.column(GROUP_KEY).to_pylist())}
        at = pa.array([index.get(k) for k in new.column(GROUP_KEY).to_pylist()], pa.int64())
        previous, current = old.select(columns).take(at), new.select(columns)
        changed = pc.is_null(at)
        for column in columns:
            a, b = current.column(column), previous.column(column)
            same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
            changed = pc.or_(changed, pc.invert(pc.fill_null(same, False)))
        gone = pc.invert(pc.is_in(old.column(GROUP_KEY), value_set=new.column(GROUP_KEY)))
        return (current.filter(changed), previous.filter(changed),
                old.select(columns).filter(gone))

    # ------------------------------------------------------------------ partitions

    def _affected(self, conn: psycopg.Connection[Any],
                  changes: Mapping[str, StateChanges]) -> set[Partition]:
        found: set[Partition] = set()
        for name, change in changes.items():
            if not change.empty:
                found |= self._partitions_of(conn, name, [change.before, change.after])
        return found

    def _watermark(self, fed: Mapping[str, FeedBatch]) -> int | None:
        """The view's watermark after the batch's events (microseconds since the epoch):
        the largest event time of its windowed input (of both joined inputs) minus the
        allowed lateness."""
        if self.join is not None:
            top = fed[self.join.left].max_event_time
            return None if top is None else top - self.join.lateness_us
        if self.window is None:
            return None
        top = fed[self.window.input].max_event_time
        return None if top is None else top - self.window.lateness_us

    # ------------------------------------------------------------------ interval joins

    def _feed_join(self, conn: psycopg.Connection[Any], head: int) -> dict[str, FeedBatch]:
        """Feed both joined inputs' events, classified together in commit order: the late
        ones recorded (``_interval_joins``), those without a time dead-lettered, the others
        appended; both feeds keep the largest event time of the two."""
        join = self.join
        assert join is not None  # noqa: S101 - only for an interval join
        sides = [(join.left, join.left_time, True), (join.right, join.right_time, False)]
        feeds = {a: f for a, f in self.feeds.items() if isinstance(f, EventFeed)}
        reads = {alias: feeds[alias].read(conn, self.states[alias], head)
                 for alias, _, _ in sides}
        floor = np.iinfo(np.int64).min
        parts = []
        for alias, column, is_left in sides:
            rows = reads[alias].rows
            times, missing = event_times(rows.column(column))
            if missing.any():
                feeds[alias].dead_letter_times(
                    conn, rows.filter(pa.array(missing)), column)
            parts.append((rows.column("position").to_numpy(), np.where(missing, floor, times),
                          np.full(rows.num_rows, is_left), missing))
        # events deleted since, read before: they move the watermark where they were
        ghosts = [(g.positions, g.times, np.full(len(g.positions), is_left))
                  for (alias, _, is_left) in sides
                  if (g := reads[alias].deleted_times) is not None and not g.empty]
        positions = np.concatenate([p[0] for p in parts] + [g[0] for g in ghosts])
        order = np.argsort(positions, kind="stable")
        late, marks, top = join.classify(
            np.concatenate([p[2] for p in parts] + [g[2] for g in ghosts])[order],
            np.concatenate([p[1] for p in parts] + [g[1] for g in ghosts])[order],
            reads[join.left].max_time)
        unordered_late = np.empty_like(late)
        unordered_late[order] = late
        unordered_marks = np.empty_like(marks)
        unordered_marks[order] = marks
        out, at = {}, 0
        for (alias, _, is_left), (where, times, _, missing) in zip(sides, parts, strict=True):
            count = len(where)
            side_late, side_marks = unordered_late[at:at + count], unordered_marks[at:at + count]
            at += count
            record_late(conn, self.view, self.generation, alias, where[side_late],
                        times[side_late], join.bounds[1] if is_left else 0, times[side_late],
                        side_marks[side_late], kind="join",
                        streams=reads[alias].rows.column("stream_id").filter(
                            pa.array(side_late)).to_pylist())
            keep = ~side_late & ~missing
            read = reads[alias]
            out[alias] = feeds[alias].write(conn, read, read.rows.filter(pa.array(keep)),
                                                 top)
        return out

    def _join_partitions(self, conn: psycopg.Connection[Any], affected: set[Partition] | None,
                         watermark: int | None) -> tuple[set[Partition], pa.Table]:
        """The left events to compute this batch (all of them: None), and the left state's
        rows with their times. A left outer join computes a left event once, when its bound
        passed (final): those not final are held back, those that became final added."""
        join = self.join
        assert join is not None  # noqa: S101 - only for an interval join
        state = self.states[join.left]
        raw = state.rows(conn)
        keys = [(p,) for p in state.raw_column(conn, raw, "position")]
        if affected is None:
            affected = set(keys)
        if join.outer:
            final = self._kept_times(conn, join.left, raw, join.left_time) + join.bounds[1] \
                < (watermark if watermark is not None else np.iinfo(np.int64).min)
            done = {k for k, f in zip(keys, final, strict=True) if f}
            affected = (affected - set(keys)) | done
        return affected, raw

    def _kept_times(self, conn: psycopg.Connection[Any], alias: str, raw: pa.Table,
                    column: str) -> np.ndarray:
        state = self.states[alias]
        times, _ = event_times(data_columns(state.typed(conn, raw)).column(column))
        return times

    def _forget(self, conn: psycopg.Connection[Any], left_rows: pa.Table,
                watermark: int | None) -> None:
        """Forget the joined events no event to come can join (``_interval_joins``)."""
        join = self.join
        assert join is not None  # noqa: S101 - only for an interval join
        if watermark is None:
            return
        if left_rows.num_rows:
            gone = join.forget_left(
                self._kept_times(conn, join.left, left_rows, join.left_time), watermark)
            self.states[join.left].move_to(
                conn, self.archives[join.left],
                left_rows.column("_position").to_numpy()[gone].tolist())
        right = self.states[join.right]
        rows = right.rows(conn)
        if rows.num_rows:
            gone = join.forget_right(
                self._kept_times(conn, join.right, rows, join.right_time), watermark)
            right.move_to(conn, self.archives[join.right],
                          rows.column("_position").to_numpy()[gone].tolist())

    def _restore(self, conn: psycopg.Connection[Any], streams: frozenset[str]) -> None:
        """Before a batch deletes the events of ``streams``: bring back from the archives
        their forgotten events, and every forgotten event joined on the same values (the
        left events whose rows change, and their partners to recompute them with). The
        batch's rows then leave as the rows of events still kept do, and the end of the
        batch forgets them again (``_forget``)."""
        join, lookup = self.join, self.plan.lookups.get(self.join.right if self.join else "")
        assert join is not None and lookup is not None  # noqa: S101 - an interval join
        columns = {join.left: lookup.via_column, join.right: lookup.column}
        values: set[str | None] = set()
        for alias, column in columns.items():
            state, archive = self.states[alias], self.archives[alias]
            archive.move_to(conn, state, column="stream_id", texts=streams)
            values |= set(state.raw_column(conn, state.rows_where(conn, "stream_id", streams),
                                           column))
        values.discard(None)
        if values:
            for alias, column in columns.items():
                self.archives[alias].move_to(conn, self.states[alias], column=column,
                                             texts=values)

    def _close_windows(self, conn: psycopg.Connection[Any], fed: FeedBatch,
                       watermark: int | None, *, find: bool) -> set[Partition]:
        """Note the windows the batch's events fell in as open; return the partitions of the
        windows the watermark passed (recomputed to write their rows final), when ``find``
        (not when the batch recomputes everything anyway)."""
        window = self.window
        assert window is not None  # noqa: S101 - only for a windowed view
        sessions = window.kind == "session"
        open_windows(conn, self.owner, fed.windows, fed.ends if sessions else None)
        if watermark is None:
            return set()
        closed = close_windows(conn, self.owner, watermark if sessions else
                               watermark - window.size_us, by_end=sessions)
        if not closed or not find:
            return set()
        starts = pa.array(closed, pa.int64()).cast(TIME_TYPE)
        values = text_array(column_for(pa.field(WINDOW_START, TIME_TYPE), key=True),
                            starts).to_pylist()
        state = self.states[window.input]
        rows = state.rows_where(conn, WINDOW_START, values)
        return self._partitions_of(conn, window.input, [rows])

    def _flag_final(self, rows: pa.Table, watermark: int | None) -> pa.Table:
        """A windowed view's rows with ``window_final`` (the watermark passed the window's
        end); with ``emit='final'``, only the final ones."""
        window = self.window
        if window is None:
            return rows
        if window.kind == "session":  # a session ends where its last event's gap does
            ends = pc.cast(rows.column(WINDOW_END), TIME_TYPE).cast(pa.int64())
        else:
            ends = pc.add(pc.cast(rows.column(WINDOW_START), TIME_TYPE).cast(pa.int64()),
                          window.size_us)
        final = pc.less_equal(ends,
                              pa.scalar(watermark if watermark is not None else -2**62,
                                        pa.int64()))
        final = pc.fill_null(final, False)
        if WINDOW_FINAL in rows.column_names:  # the empty rows of a failed partition
            rows = rows.drop_columns([WINDOW_FINAL])
        rows = rows.append_column(WINDOW_FINAL, final)
        return rows.filter(final) if window.emit == "final" else rows

    def _partitions_of(self, conn: psycopg.Connection[Any], name: str,
                       raws: list[pa.Table]) -> set[Partition]:
        state = self.states[name]
        if name in self.plan.direct:
            out: set[Partition] = set()
            for raw in raws:
                columns = [state.raw_column(conn, raw, c) for c in self.plan.direct[name]]
                out |= set(zip(*columns, strict=True))
            return out
        lookup = self.plan.lookups[name]
        values = {v for raw in raws for v in state.raw_column(conn, raw, lookup.column)
                  if v is not None}
        if not values:
            return set()
        joined = self.states[lookup.via].rows_where(conn, lookup.via_column, values)
        return self._partitions_of(conn, lookup.via, [joined])

    def _input_rows(self, conn: psycopg.Connection[Any],
                    affected: set[Partition] | None) -> dict[str, pa.Table]:
        """Each input's raw rows of the affected partitions (all rows: everything)."""
        if affected is None or self.plan.whole:
            return {name: state.rows(conn) for name, state in self.states.items()}
        rows: dict[str, pa.Table] = {}
        for name, columns in self.plan.direct.items():
            state = self.states[name]
            raw = state.rows_where(conn, columns[0], {p[0] for p in affected})
            if len(columns) > 1:
                keys = list(zip(*(state.raw_column(conn, raw, c) for c in columns),
                                strict=True))
                raw = raw.filter(pa.array([k in affected for k in keys], pa.bool_()))
            rows[name] = raw
        for name, lookup in self.plan.lookups.items():
            via = self.states[lookup.via].raw_column(conn, rows[lookup.via], lookup.via_column)
            rows[name] = self.states[name].rows_where(
                conn, lookup.column, {v for v in via if v is not None})
        return rows

    def _recompute(self, conn: psycopg.Connection[Any], affected: set[Partition] | None
                   ) -> tuple[pa.Table, dict[Partition, str], set[Partition] | None]:
        """The view's rows of the affected partitions, computed by Spark; the partitions on
        whose data the query fails (a division by zero, a cast), each with its error; and the
        partitions computed (None: all of them, none failed).

        A failure on the data is narrowed down by halves to the partitions that cause it:
        those keep their rows as they were and go to the dead letters, the others progress."""
        errors = _data_errors()
        try:
            return self._run(conn, affected), {}, affected
        except errors as e:
            partitions = affected if affected is not None else self._all_partitions(conn)
            rows, failed = self._bisect(conn, sorted(partitions, key=repr), e, errors)
            return rows, failed, partitions - set(failed)

    def _bisect(self, conn: psycopg.Connection[Any], partitions: list[Partition],
                error: BaseException, errors: tuple[type[BaseException], ...]
                ) -> tuple[pa.Table, dict[Partition, str]]:
        if len(partitions) == 1:
            return self._output_schema().empty_table(), {partitions[0]: _first_line(error)}
        middle = len(partitions) // 2
        tables, failed = [], {}
        for half in (partitions[:middle], partitions[middle:]):
            try:
                tables.append(self._run(conn, set(half)))
            except errors as e:
                rows, bad = self._bisect(conn, half, e, errors)
                tables.append(rows)
                failed.update(bad)
        return pa.concat_tables(tables), failed

    def _all_partitions(self, conn: psycopg.Connection[Any]) -> set[Partition]:
        """Every partition the direct inputs hold (to narrow down a failed full recompute);
        a view without partitions is one."""
        if self.plan.whole:
            return {()}
        found: set[Partition] = set()
        for name in self.plan.direct:
            found |= self._partitions_of(conn, name, [self.states[name].rows(conn)])
        return found

    def _output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, _arrow_type(self._schema, c.name))
                          for c in self._schema.columns])

    def compute(self) -> pa.Table:
        """The whole view computed from its inputs' current rows (a full recompute, as a
        baseline: ``step`` recomputes only what a batch touches)."""
        conn = self.connection()
        if self.folded is not None:
            output = self._output_schema()
            rows = self.folded.all_rows(conn, output.remove(output.get_field_index(WINDOW_FINAL)))
        else:
            rows = self._run(conn, None)
        if self.window is None:
            return rows
        top = conn.execute("SELECT max_event_time FROM lakefold.event_feeds WHERE stream = %s",
                           (self.feeds[self.window.input].name,)).fetchone()
        watermark = None if top is None or top[0] is None else \
            int(top[0]) - self.window.lateness_us
        return self._flag_final(rows, watermark)

    def _run(self, conn: psycopg.Connection[Any], affected: set[Partition] | None) -> pa.Table:
        """The user's query over the inputs' rows of ``affected`` (None: all rows)."""
        from pyspark.errors import AnalysisException

        session = self.session
        for name, raw in self._input_rows(conn, affected).items():
            typed = data_columns(self.states[name].typed(conn, raw))
            session.createDataFrame(typed).createOrReplaceTempView(name)
        try:
            with no_duplicate_error_logs():  # lakefold's error says it; pyspark's log repeats it
                if isinstance(self.query, str):
                    df = session.sql(self.query)
                else:
                    df = self.query(**{name: session.table(name) for name in self.inputs})
                result = df.toArrow()
        except AnalysisException as e:
            raise ProjectionStateError(drift_message(
                self.view, _first_line(e), describe_inputs(conn, self.inputs))) from e
        schema = self._output_schema()
        return result.cast(pa.schema([schema.field(n) for n in result.schema.names]))

    def _named(self, failed: Mapping[Partition, str]
               ) -> tuple[tuple[dict[str, str | None], str], ...]:
        return tuple((dict(zip(self.plan.partition, partition, strict=True)), error)
                     for partition, error in sorted(failed.items(), key=repr))

    # ------------------------------------------------------------------ diff

    def _old_rows(self, conn: psycopg.Connection[Any],
                  affected: set[Partition] | None) -> pa.Table:
        """The view's current rows of the affected partitions (typed, data columns)."""
        if affected is None or (self.plan.whole and affected):
            return data_columns(self.own.typed(conn, self.own.rows(conn)))
        if not affected:
            return data_columns(self.own.typed(conn, self.own.rows_where(
                conn, self._schema.columns[0].name, ())))
        partition = self.plan.partition
        normal = {tuple(v) for v in zip(*(self._as_output(conn, i, [p[i] for p in affected])
                                          for i in range(len(partition))), strict=True)}
        raw = self.own.rows_where(conn, partition[0], {p[0] for p in normal})
        if len(partition) > 1:
            keys = list(zip(*(self.own.raw_column(conn, raw, c) for c in partition),
                            strict=True))
            raw = raw.filter(pa.array([k in normal for k in keys], pa.bool_()))
        return data_columns(self.own.typed(conn, raw))

    def _as_output(self, conn: psycopg.Connection[Any], index: int,
                   values: list[str | None]) -> list[str | None]:
        """Partition values as an input printed them → as the output stream prints them."""
        name, columns = next(iter(self.plan.direct.items()))
        meta = self.states[name].meta(conn)
        assert meta.latest is not None  # noqa: S101 - a stream with rows has a schema
        source = next(c for c in meta.latest.columns if c.name == columns[index])
        target = next(c for c in self._schema.columns if c.name == self.plan.partition[index])
        typed = typed_array(source, pa.array(values, pa.string()))
        field = pa.field(target.name, _arrow_type(self._schema, target.name))
        found: list[str | None] = text_array(column_for(field, key=target.key),
                                             pc.cast(typed, field.type)).to_pylist()
        return found

    def _diff(self, old: pa.Table, new: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(upserts, the previous row of each upsert or an empty row, deletes)."""
        key = self.plan.key
        columns = [c.name for c in self._schema.columns]
        new = new.select(columns)
        old = old.select(columns)

        def keyed(table: pa.Table) -> dict[tuple[Any, ...], dict[str, Any]]:
            out: dict[tuple[Any, ...], dict[str, Any]] = {}
            for row in table.to_pylist():
                k = tuple(row[c] for c in key)
                if k in out:
                    raise MissingKeyError(
                        f"view {self.view}: two output rows have the key "
                        f"{dict(zip(key, k, strict=True))}; the key must identify one row")
                out[k] = row
            return out

        before, after = keyed(old), keyed(new)
        upserts = [row for k, row in after.items() if before.get(k) != row]
        previous = [before.get(tuple(row[c] for c in key), {}) for row in upserts]
        deletes = [row for k, row in before.items() if k not in after]
        schema = new.schema
        return (pa.Table.from_pylist(upserts, schema=schema),
                pa.Table.from_pylist(previous, schema=schema),
                pa.Table.from_pylist(deletes, schema=schema))

    @staticmethod
    def _commit_point(conn: psycopg.Connection[Any],
                      changes: Mapping[str, StateChanges]) -> tuple[int, datetime]:
        """The newest commit among the inputs' applied records (the output's commit LSN and
        time: the source commit the batch's rows reflect)."""
        lsn, ts = 0, None
        for change in changes.values():
            for raw in (change.after, change.before):
                if raw.num_rows:
                    lsn = max(lsn, int(pc.max(raw.column("_commit_lsn")).as_py()))
                    top = pc.max(raw.column("_commit_ts")).as_py()
                    ts = top if ts is None else max(ts, top)
        moment = datetime.fromtimestamp(ts / 1_000_000, UTC) if ts is not None else \
            datetime.now(UTC)
        return lsn, moment


def drift_message(view: str, error: str, inputs: str) -> str:
    """Why a view stopped fitting its inputs (``inputs``: ``describe_inputs``), and the fix."""
    return (f"view {view}: the query no longer fits its inputs ({error}); the inputs' schemas "
            f"now: {inputs}. Change the query to the new columns (a new definition rebuilds "
            "the view), or the tables back")


def describe_inputs(conn: psycopg.Connection[Any], inputs: Mapping[str, str]) -> str:
    """Each input stream's newest schema version, where it began (the DDL's place in the
    stream), and its columns (for messages)."""
    parts = []
    for name, stream in inputs.items():
        meta = stream_meta(conn, stream)
        latest = meta.latest
        columns = ", ".join(c.name for c in latest.columns) if latest else "none"
        version = latest.version if latest else 0
        since = ""
        if version > 1:
            row = conn.execute(
                "SELECT s.created_lsn, (SELECT min(c.position) FROM lakefold.changelog c "
                " WHERE c.stream_id = s.stream_id AND c.schema_version = s.version) "
                "FROM lakefold.changelog_schemas s WHERE s.stream_id = %s "
                "AND s.version = %s", (meta.info.stream_id, version)).fetchone()
            if row is not None:
                lsn = int(row[0] or 0)
                since = f" since position {row[1] if row[1] is not None else '?'}, " \
                    f"source LSN {format_lsn(lsn)}"
        parts.append(f"{name} ({stream}, schema version {version}{since}: {columns})")
    return "; ".join(parts)


def input_schema(store_dsn: str, stream: str) -> pa.Schema:
    """The Arrow schema of a stream's rows as a view's query sees them (no metadata)."""
    with ChangelogStore(store_dsn) as store:
        return row_schema(store, stream)


def open_view(spark: SparkSession, store_dsn: str, *, view: str, generation: int,
              inputs: Mapping[str, str], query: Query, key: Sequence[str]) -> ViewMaintainer:
    """Analyze a view over its inputs' streams and install one generation of it (states,
    output stream): ready to ``step``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schemas = {name: from_arrow_schema(input_schema(store_dsn, stream))
               for name, stream in inputs.items()}
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        metas = {name: stream_meta(conn, stream).latest for name, stream in inputs.items()}
    keys = {name: tuple(c.name for c in meta.columns if c.key) if meta is not None else ()
            for name, meta in metas.items()}
    plan = analyze(spark, view, schemas, query, key, input_keys=keys)
    maintainer = ViewMaintainer(spark, store_dsn, view=view, generation=generation,
                                inputs=inputs, query=query, plan=plan)
    maintainer.install(view_frame(spark, schemas, query).toArrow().schema)
    return maintainer


def _arrow_type(schema: Any, name: str) -> pa.DataType:
    from lakefold.store.internals import arrow_type

    return arrow_type(next(c for c in schema.columns if c.name == name))

