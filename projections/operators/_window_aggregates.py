"""A windowed view's aggregates folded straight from its event feed.

A view that is one ``GROUP BY`` of aggregates kept by their changes (``_view_aggregates``)
over a tumbling, hopping or sliding window of one event input needs no row per event to
answer its query: its feed (``_view_events``) classifies each event into its windows and
folds the window rows into the aggregates, in the batch's transaction; nothing is written to
the feed's stream or to an input state, and Spark is not asked (the other windowed views
recompute their touched partitions). A window's ``window_end`` follows from its start, so
the groups are the view's partitions.

One row per folded (event, window) is kept all the same, narrow and never read but by one
index: its stream and the texts of its group and aggregate columns (the *contributions*).
A deleted stream's contributions are folded out with the sign -1, as the rows of a deleted
stream leave any other view.

The rows of the windows the watermark passed are read from the group table by the window
column (indexed), to write them final. The touched groups are read before the fold and after
it: the rows before, flagged final by the previous watermark, are the rows the view wrote
last (every batch writes the groups it touched and the windows it closed), so the diff needs
no copy of the view's rows.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from lakefold.projections.definitions._windows import TIME_TYPE, WINDOW_START, event_times
from lakefold.projections.operators._view_aggregates import (
    DELTA_TABLE,
    GROUP_KEY,
    AggregateState,
    copy_csv,
)
from lakefold.projections.plan._aggregate_plan import AggregatePlan
from lakefold.projections.state._stream_state import STATE_SCHEMA
from lakefold.store.internals import ColumnSchema, column_for, text_array


class WindowAggregates(AggregateState):
    """The aggregates of one windowed view generation, folded from its feed's window rows
    (``schema``: a feed row's); see the module docstring."""

    def __init__(self, owner: str, plan: AggregatePlan, schema: pa.Schema,
                 time_column: str) -> None:
        super().__init__(owner, plan, None)
        self.schema = schema
        #: The feed rows' event time (kept with each contribution: a deleted event's time
        #: outlives it, ``_deleted_events``).
        self.time_column = time_column
        self.contributions = sql.Identifier(STATE_SCHEMA, f"{self.name}_c")
        self._window = next(i for i, (_, c) in enumerate(plan.groups) if c == WINDOW_START)
        self._inputs = [c for _, c in plan.groups] + list(plan.columns)
        #: Whether the batch folds contributions out (groups may empty).
        self._retracting = False

    def create(self, conn: psycopg.Connection[Any]) -> None:
        super().create(conn)
        columns = sql.SQL(", ").join(sql.SQL("{} text").format(sql.Identifier(n))
                                     for n in self.texts)
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (stream_id text NOT NULL, {})")
                     .format(self.contributions, columns))
        # added after the first release: the event's position and time
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS position bigint, "
                             "ADD COLUMN IF NOT EXISTS event_time bigint")
                     .format(self.contributions))
        conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (stream_id)").format(
            sql.Identifier(f"{self.name}_cs"), self.contributions))
        conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(f"{self.name}_w"), self.groups,
            sql.Identifier(f"g{self._window}")))

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        super().drop(conn)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.contributions))

    def _columns(self, conn: psycopg.Connection[Any]) -> dict[str, ColumnSchema]:
        return {f.name: column_for(f, key=False) for f in self.schema}

    def times_of(self, conn: psycopg.Connection[Any], streams: Collection[str]
                 ) -> tuple[list[int], list[int]]:
        """The positions and times of the folded events of ``streams`` (ascending)."""
        found = conn.execute(sql.SQL(
            "SELECT DISTINCT position, event_time FROM {} WHERE stream_id = ANY(%s) AND "
            "position IS NOT NULL AND event_time IS NOT NULL ORDER BY position").format(
                self.contributions), (sorted(streams),)).fetchall()
        return [int(p) for p, _ in found], [int(t) for _, t in found]

    def fold(self, conn: psycopg.Connection[Any], rows: pa.Table,
             deleted: Collection[str]) -> int:
        """Fold window rows in, and the contributions of the ``deleted`` streams out (before
        them: a batch's rows are of streams not deleted in it); returns how many rows went
        either way. ``finish`` applies them."""
        self._create_delta(conn, "stream_id", "position", "event_time")
        names = sql.SQL(", ").join(sql.Identifier(n) for n in self.texts)
        moved = 0
        if deleted:
            self._retracting = True
            moved += conn.execute(sql.SQL(
                "WITH gone AS (DELETE FROM {c} WHERE stream_id = ANY(%s) RETURNING {names}) "
                "INSERT INTO {delta} (sign, {names}) SELECT -1, {names} FROM gone").format(
                    c=self.contributions, names=names, delta=sql.Identifier(DELTA_TABLE)),
                (sorted(deleted),)).rowcount
        if rows.num_rows:  # with their streams: ``finish`` keeps them as contributions
            times, _ = event_times(rows.column(self.time_column))
            arrays = [pa.array(np.ones(rows.num_rows, dtype=np.int32)),
                      pc.cast(rows.column("stream_id"), pa.string()),
                      pc.cast(rows.column("position"), pa.string()),
                      pc.cast(pa.array(times, pa.int64()), pa.string())]
            arrays += [text_array(column_for(self.schema.field(c), key=False), rows.column(c))
                       for c in self._inputs]
            copy_csv(conn, pa.Table.from_arrays(arrays, names=[
                "sign", "stream_id", "position", "event_time", *self.texts]),
                sql.SQL("{} (sign, stream_id, position, event_time, {})").format(
                    sql.Identifier(DELTA_TABLE), names))
            moved += rows.num_rows
        return moved

    def finish(self, conn: psycopg.Connection[Any], closed: Sequence[int],
               output: pa.Schema) -> tuple[pa.Table, pa.Table]:
        """Apply what ``fold`` gathered; the output rows of the groups it touched and of
        the windows starting at ``closed`` (microseconds), before and after, each with its
        group key (``GROUP_KEY``)."""
        self._create_delta(conn, "stream_id", "position", "event_time")
        names = sql.SQL(", ").join(sql.Identifier(n) for n in self.texts)
        conn.execute(sql.SQL(
            "INSERT INTO {} (stream_id, position, event_time, {names}) SELECT stream_id, "
            "position::bigint, event_time::bigint, {names} FROM {} WHERE sign = 1").format(
                self.contributions, sql.Identifier(DELTA_TABLE), names=names))
        starts = text_array(column_for(pa.field(WINDOW_START, TIME_TYPE), key=False),
                            pa.array(list(closed), pa.int64()).cast(TIME_TYPE)).to_pylist()
        also = sql.SQL("g.{} = ANY({}::text[])").format(
            sql.Identifier(f"g{self._window}"), sql.Literal(starts)) if starts else None
        before = self._touched(conn, output, everything=False, also=also, keep_delta=True)
        self._fold(conn, retracting=self._retracting)
        self._retracting = False
        return before, self._touched(conn, output, everything=False, also=also)

    def all_rows(self, conn: psycopg.Connection[Any], output: pa.Schema) -> pa.Table:
        """The output rows of every group."""
        return self._touched(conn, output, everything=True).drop_columns([GROUP_KEY])
