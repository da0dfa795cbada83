"""What every operator of a view shares: one generation's inputs, states, feeds and output
stream, and the steps of a batch that do not depend on the plan's tag (the cut, applying the
states, the partitions a change touches, Spark's recompute of them, the diff against the view's
own rows). The operators (``_recompute``, ``_windowed``, ``_kept_aggregate``, ``_interval_join``,
``_window_fold``) execute the tag with these; ``_view_maintainer`` drives them.

A view reads changelog streams (captured tables, or other views' output streams) and writes
its output rows as a derived stream of its own (``store._derived_streams``), which targets and
downstream views read like any captured table. Per input it keeps a *state*, the input's latest
row per key (``state._stream_state``); it keeps one of its own output too, to know the rows a
recomputed partition replaces.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

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
)
from lakefold.projections.exceptions import MissingKeyError, ProjectionStateError
from lakefold.projections.operators._changelog_windows import ChangelogWindowFeed
from lakefold.projections.operators._local_query import fits, run_local
from lakefold.projections.operators._view_aggregates import GROUP_KEY
from lakefold.projections.operators._view_events import EventFeed, Feed
from lakefold.projections.plan._local_plan import LOCAL_ROWS
from lakefold.projections.plan._view_cuts import Cut, choose_cut
from lakefold.projections.plan._view_plan import ViewPlan
from lakefold.projections.state._late_events import forget_late_generation, install_late_events
from lakefold.projections.state._stream_state import LatestRows, StateChanges
from lakefold.projections.state._window_book import forget_windows
from lakefold.schemas import EventRegistry
from lakefold.spark.internals import no_duplicate_error_logs
from lakefold.store.internals import (
    ChangelogStore,
    DerivedStream,
    column_for,
    commit_at,
    data_columns,
    stream_meta,
    text_array,
    typed_array,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Advisory lock namespace: one maintainer per view generation.
LOCK_NAMESPACE = zlib.crc32(b"lakefold.view") & 0x7FFF_FFFF
Partition = tuple[str | None, ...]
Engine = Literal["auto", "spark", "local"]

#: The prefix of every view's output stream.
VIEW_STREAM_PREFIX = "lakefold_views."


def output_stream(view: str, generation: int) -> str:
    """The derived stream a generation of ``view`` writes."""
    return f"{VIEW_STREAM_PREFIX}{view}_g{generation}"


def view_owner(view: str, generation: int) -> str:
    """What a generation of ``view`` owns its input states and durable readers as."""
    return f"view:{view}@{generation}"


@dataclass(frozen=True)
class ViewGeneration:
    """What one generation of a view is maintained from: its definition's parts as the
    runtime resolved them, and the plan (the maintainer's options, in one value)."""

    view: str
    generation: int
    #: Input name in the query → the stream it reads (a table's, another view's output).
    inputs: Mapping[str, str]
    query: Query
    plan: ViewPlan
    #: Event inputs, each fed into a derived stream of this generation (``_view_events``).
    events: Mapping[str, EventInput] = field(default_factory=dict)
    registry: EventRegistry | None = None
    #: The view's window over event time (``_windows``), over one of its inputs.
    window: Window | None = None
    #: The most records a feed moves in one batch.
    feed_limit: int = 1_000_000
    #: The live generation a rebuild starts beside (its feeds start where that one is).
    live_generation: int | None = None
    #: Where recomputes run (see ``ViewCore.engine``).
    engine: Engine = "auto"


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


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def data_errors() -> tuple[type[BaseException], ...]:
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



class ViewCore:
    """One generation of one view: its inputs' states and feeds, its output stream and its own
    state, and the batch steps every operator shares (see the module docstring)."""

    def __init__(self, spark: SparkSession, store_dsn: str, setup: ViewGeneration, *,
                 stateless: str | None = None) -> None:
        """``stateless``: an input whose rows the operator consumes without keeping them."""
        self.view = setup.view
        self.generation = setup.generation
        self.owner = view_owner(setup.view, setup.generation)
        self.dsn = store_dsn
        self.window = window = setup.window
        self.store = ChangelogStore(store_dsn)
        #: Event inputs, each fed into a derived stream of this generation (``_view_events``),
        #: and a windowed table's changes (``_changelog_windows``).
        self.feeds: dict[str, Feed] = {
            alias: EventFeed(store_dsn, view=setup.view, generation=setup.generation,
                             alias=alias, source=source, registry=setup.registry,
                             window=window if window and window.input == alias else None,
                             limit=setup.feed_limit, live_generation=setup.live_generation)
            for alias, source in setup.events.items()}
        if window is not None and window.input in setup.inputs:
            self.feeds[window.input] = ChangelogWindowFeed(
                self.store, view=setup.view, generation=setup.generation, alias=window.input,
                table=setup.inputs[window.input], window=window, limit=setup.feed_limit,
                # a reader of its own: the same table may also be a plain input of the view
                owner=f"{self.owner}:window:{window.input}")
        # name in the query → stream
        self.inputs = dict(setup.inputs) | {alias: f.name for alias, f in self.feeds.items()}
        self.query = setup.query
        self.plan = setup.plan
        self.session = spark.newSession()
        # Input name → its state. Names over one stream (a self-join written as two inputs of
        # one table or view) share one state, applied once a batch: each name then sees the
        # batch's images of that stream (``apply_states``).
        shared: dict[str, LatestRows] = {}
        self.states = {name: shared.setdefault(stream, LatestRows(self.owner, stream))
                       for name, stream in self.inputs.items() if name != stateless}
        self.output = DerivedStream(output_stream(setup.view, setup.generation))
        self.own = LatestRows(self.owner, self.output.name)
        #: The output stream's schema (set by ``install``).
        self.stream_schema: Any = None
        #: Where recomputes run: "auto" (in the process when the plan allows and the rows are
        #: few, else Spark), "spark" or "local" (tests force each path with these).
        self.engine = setup.engine
        #: Where the last recompute ran ("local" or "spark"; None: none yet).
        self.last_engine: str | None = None

    def forget_window_state(self, conn: psycopg.Connection[Any]) -> None:
        """Forget a windowed generation's late events and window book."""
        with conn.transaction():
            install_late_events(conn)
            forget_late_generation(conn, self.view, self.generation)
        forget_windows(conn, self.owner)

    def window_watermark(self, conn: psycopg.Connection[Any]) -> int | None:
        """The watermark of the view's windowed input as its feed last left it."""
        window = self.window
        assert window is not None  # noqa: S101 - only for a windowed view
        top = conn.execute("SELECT max_event_time FROM lakefold.event_feeds WHERE stream = %s",
                           (self.feeds[window.input].name,)).fetchone()
        return None if top is None or top[0] is None else int(top[0]) - window.lateness_us

    def connection(self) -> psycopg.Connection[Any]:
        """The maintainer's store connection (reopened after a loss)."""
        return self.store.connection()

    def close(self) -> None:
        self.store.close()

    def lock(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                     (LOCK_NAMESPACE, zlib.crc32(self.owner.encode()) & 0x7FFF_FFFF))

    def cut(self, conn: psycopg.Connection[Any], starts: Mapping[str, int]) -> Cut:
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

    def output_head(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT head FROM lakefold.changelog_streams WHERE name = %s",
                           (self.output.name,)).fetchone()
        return 0 if row is None else int(row[0])

    def first_commit(self, conn: psycopg.Connection[Any],
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

    def apply_states(self, conn: psycopg.Connection[Any], heads: Mapping[str, int]
                      ) -> dict[str, StateChanges]:
        """Apply each state up to its stream's head at the cut; every input name gets its
        stream's changes (names sharing a stream get the same, applied once)."""
        applied: dict[str, StateChanges] = {}
        for state in self.states.values():
            if state.stream not in applied:
                applied[state.stream] = state.apply(conn, int(heads.get(state.stream, 0)) + 1)
        return {name: applied[state.stream] for name, state in self.states.items()}

    def affected(self, conn: psycopg.Connection[Any],
                  changes: Mapping[str, StateChanges]) -> set[Partition]:
        found: set[Partition] = set()
        for name, change in changes.items():
            if not change.empty:
                found |= self.partitions_of(conn, name, [change.before, change.after])
        return found

    def partitions_of(self, conn: psycopg.Connection[Any], name: str,
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
        return self.partitions_of(conn, lookup.via, [joined])

    def input_rows(self, conn: psycopg.Connection[Any],
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

    def recompute(self, conn: psycopg.Connection[Any], affected: set[Partition] | None
                   ) -> tuple[pa.Table, dict[Partition, str], set[Partition] | None]:
        """The view's rows of the affected partitions, computed by Spark; the partitions on
        whose data the query fails (a division by zero, a cast), each with its error; and the
        partitions computed (None: all of them, none failed).

        A failure on the data is narrowed down by halves to the partitions that cause it:
        those keep their rows as they were and go to the dead letters, the others progress."""
        errors = data_errors()
        try:
            return self.run_query(conn, affected), {}, affected
        except errors as e:
            partitions = affected if affected is not None else self._all_partitions(conn)
            rows, failed = self._bisect(conn, sorted(partitions, key=repr), e, errors)
            return rows, failed, partitions - set(failed)

    def _bisect(self, conn: psycopg.Connection[Any], partitions: list[Partition],
                error: BaseException, errors: tuple[type[BaseException], ...]
                ) -> tuple[pa.Table, dict[Partition, str]]:
        if len(partitions) == 1:
            return self.output_schema().empty_table(), {partitions[0]: first_line(error)}
        middle = len(partitions) // 2
        tables, failed = [], {}
        for half in (partitions[:middle], partitions[middle:]):
            try:
                tables.append(self.run_query(conn, set(half)))
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
            found |= self.partitions_of(conn, name, [self.states[name].rows(conn)])
        return found

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type_of(self.stream_schema, c.name))
                          for c in self.stream_schema.columns])

    def run_query(self, conn: psycopg.Connection[Any], affected: set[Partition] | None, *,
                  engine: Engine | None = None) -> pa.Table:
        """The user's query over the inputs' rows of ``affected`` (None: all rows): in the
        process when the plan allows it and the rows are few (``plan._local_plan``; the same
        rows Spark gives), else on Spark; ``engine`` overrides the view's ``engine``."""
        engine = engine or self.engine
        from pyspark.errors import AnalysisException

        inputs = {name: data_columns(self.states[name].typed(conn, raw))
                  for name, raw in self.input_rows(conn, affected).items()}
        schema = self.output_schema()
        local = self.plan.local
        if local is not None and engine != "spark" and fits(local, inputs) and (
                engine == "local" or sum(t.num_rows for t in inputs.values()) <= LOCAL_ROWS):
            result = run_local(local, inputs)
            self.last_engine = "local"
            return result.cast(pa.schema([schema.field(n) for n in result.schema.names]))
        self.last_engine = "spark"
        session = self.session
        for name, typed in inputs.items():
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
                self.view, first_line(e), describe_inputs(conn, self.inputs))) from e
        return result.cast(pa.schema([schema.field(n) for n in result.schema.names]))

    def named(self, failed: Mapping[Partition, str]
               ) -> tuple[tuple[dict[str, str | None], str], ...]:
        return tuple((dict(zip(self.plan.partition, partition, strict=True)), error)
                     for partition, error in sorted(failed.items(), key=repr))

    def old_rows(self, conn: psycopg.Connection[Any],
                  affected: set[Partition] | None) -> pa.Table:
        """The view's current rows of the affected partitions (typed, data columns)."""
        if affected is None or (self.plan.whole and affected):
            return data_columns(self.own.typed(conn, self.own.rows(conn)))
        if not affected:
            return data_columns(self.own.typed(conn, self.own.rows_where(
                conn, self.stream_schema.columns[0].name, ())))
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
        target = next(c for c in self.stream_schema.columns if c.name == self.plan.partition[index])
        typed = typed_array(source, pa.array(values, pa.string()))
        field = pa.field(target.name, arrow_type_of(self.stream_schema, target.name))
        found: list[str | None] = text_array(column_for(field, key=target.key),
                                             pc.cast(typed, field.type)).to_pylist()
        return found

    def diff(self, old: pa.Table, new: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(upserts, the previous row of each upsert or an empty row, deletes)."""
        key = self.plan.key
        columns = [c.name for c in self.stream_schema.columns]
        new = new.select(columns)
        old = old.select(columns)
        if old.num_rows == 0:  # the first batch of a generation (a rebuild): all new rows
            self._check_unique(new)
            return new, pa.table({f.name: pa.nulls(new.num_rows, f.type) for f in new.schema},
                                 schema=new.schema), old
        if all(_comparable(f, f.name in key) for f in new.schema):
            return self._diff_columns(old, new)
        return self._diff_rows(old, new)

    def _diff_rows(self, old: pa.Table, new: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
        """``diff`` row by row, in Python (nested columns, float keys)."""
        key = self.plan.key

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

    def _diff_columns(self, old: pa.Table, new: pa.Table
                      ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """``diff`` with Arrow, column by column (the rows, in the order, ``_diff_rows`` gives):
        keys matched through one dictionary code per key column, NULL being a code of its own
        (a NULL key is a key like any other)."""
        self._check_unique(new)
        key = list(self.plan.key)
        split = old.num_rows
        codes = [pc.dictionary_encode(pa.concat_arrays([old.column(k).combine_chunks(),
                                                        new.column(k).combine_chunks()]),
                                      null_encoding="encode").indices for k in key]
        names = [f"k{i}" for i in range(len(key))]
        before = pa.table([*(c.slice(0, split) for c in codes),
                           pa.array(np.arange(split, dtype=np.int64))], names=[*names, "o"])
        after = pa.table([*(c.slice(split) for c in codes),
                          pa.array(np.arange(new.num_rows, dtype=np.int64))], names=[*names, "n"])
        joined = after.join(before, keys=names, join_type="full outer", use_threads=False)
        kept = joined.filter(pc.is_valid(joined.column("n"))).sort_by("n")
        current = new.take(kept.column("n"))
        previous = old.take(kept.column("o"))  # a NULL index: an empty row
        changed = pc.is_null(kept.column("o"))
        for column in new.column_names:
            a, b = current.column(column), previous.column(column)
            same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
            changed = pc.or_(changed, pc.invert(pc.fill_null(same, False)))
        gone = joined.filter(pc.is_null(joined.column("n"))).sort_by("o")
        return current.filter(changed), previous.filter(changed), old.take(gone.column("o"))

    def _check_unique(self, rows: pa.Table) -> None:
        """MissingKeyError when two of ``rows`` have one key (as ``diff`` finds it)."""
        key = list(self.plan.key)
        if rows.num_rows < 2:
            return
        counts = rows.select(key).group_by(key, use_threads=False).aggregate([([], "count_all")])
        twice = counts.filter(pc.greater(counts.column("count_all"), 1))
        if twice.num_rows:
            first = twice.slice(0, 1).to_pylist()[0]
            found = {k: first[k] for k in key}
            raise MissingKeyError(f"view {self.view}: two output rows have the key {found}; "
                                  "the key must identify one row")

    def diff_groups(self, old: pa.Table, new: pa.Table
                     ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """``_diff`` of rows that carry their group key (``GROUP_KEY``), column by column."""
        columns = [c.name for c in self.stream_schema.columns]
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

    @staticmethod
    def commit_point(conn: psycopg.Connection[Any],
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


def _comparable(field: pa.Field, key: bool) -> bool:
    """Whether ``diff`` compares a column with Arrow: an atomic type, and no float in a key
    (NaN keys match as Python's dictionaries match them, not as Arrow's hashing does)."""
    kind = field.type
    return not pa.types.is_nested(kind) and not pa.types.is_dictionary(kind) and not (
        key and pa.types.is_floating(kind))


def flag_final(window: Window | None, rows: pa.Table, watermark: int | None) -> pa.Table:
    """A windowed view's rows with ``window_final`` (the watermark passed the window's
    end); with ``emit='final'``, only the final ones."""
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


def arrow_type_of(schema: Any, name: str) -> pa.DataType:
    """The Arrow type of column ``name`` of a stream schema."""
    from lakefold.store.internals import arrow_type

    return arrow_type(next(c for c in schema.columns if c.name == name))
