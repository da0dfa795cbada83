"""``INTERVAL_JOIN``: two event inputs joined within a time bound read off the query's ON
clause (``definitions._view_inputs.IntervalJoin``), with bounded state.

A batch is ``_recompute``'s with three steps changed:

- **feed**: both inputs' events are classified together, in commit order: those later than
  the bound allows are recorded late (``state._late_events``), those without a time
  dead-lettered, the others appended; both feeds keep the largest event time of the two;
- **apply**: the left events to compute are the affected ones; a left *outer* join computes a
  left event once, when its bound passed (final), so those not final are held back;
- **commit**: the joined events no event to come can join are forgotten: moved from the input
  states to archives, from which a stream deletion brings them back (``_restore``) so that
  their rows leave as the rows of events still kept do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa

from lakefold.projections.definitions._view_inputs import IntervalJoin
from lakefold.projections.definitions._windows import event_times
from lakefold.projections.operators._recompute import RecomputeBatch, RecomputeOperator
from lakefold.projections.operators._view_core import BatchResult, Partition, ViewCore
from lakefold.projections.operators._view_events import EventFeed, FeedBatch
from lakefold.projections.plan._view_plan import Operator
from lakefold.projections.state._deadletters import install_dead_letters
from lakefold.projections.state._deleted_events import TimeSource
from lakefold.projections.state._late_events import (
    forget_late_generation,
    install_late_events,
    record_late,
)
from lakefold.projections.state._stream_state import LatestRows
from lakefold.store.internals import data_columns


class IntervalJoinOperator(RecomputeOperator):
    """Join two event inputs within a time bound (see the module docstring)."""

    tag = Operator.INTERVAL_JOIN

    def __init__(self, core: ViewCore) -> None:
        super().__init__(core)
        join = core.plan.join
        assert join is not None  # noqa: S101 - the planner tags interval joins only
        self.join: IntervalJoin = join
        self.feeds: dict[str, EventFeed] = {}
        #: Each side's forgotten events, kept aside (``_restore``).
        self.archives: dict[str, LatestRows] = {}
        for alias, column in ((join.left, join.left_time), (join.right, join.right_time)):
            feed = core.feeds[alias]
            assert isinstance(feed, EventFeed)  # noqa: S101 - joins are of events
            feed.times = TimeSource(core.view, alias, column)
            feed.on_deleted = self._restore
            self.feeds[alias] = feed
            self.archives[alias] = LatestRows(f"{core.owner}:archive", core.inputs[alias])

    def create(self, conn: psycopg.Connection[Any]) -> None:
        install_late_events(conn)
        install_dead_letters(conn)
        wanted = self.core.plan.lookup_columns()
        for alias, archive in self.archives.items():
            archive.create(conn, (*wanted.get(alias, ()), "stream_id"))

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        for archive in self.archives.values():
            archive.drop(conn)
        with conn.transaction():
            install_late_events(conn)
            forget_late_generation(conn, self.core.view, self.core.generation)

    def watermark(self, fed: Mapping[str, FeedBatch]) -> int | None:
        top = fed[self.join.left].max_event_time
        return None if top is None else top - self.join.lateness_us

    def advance(self, conn: psycopg.Connection[Any], head: int) -> dict[str, FeedBatch]:
        """Feed both joined inputs' events, classified together in commit order: the late
        ones recorded, those without a time dead-lettered, the others appended; both feeds
        keep the largest event time of the two."""
        join, core, feeds = self.join, self.core, self.feeds
        sides = [(join.left, join.left_time, True), (join.right, join.right_time, False)]
        reads = {alias: feeds[alias].read(conn, core.states[alias], head)
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
        out: dict[str, FeedBatch] = {}
        at = 0
        for (alias, _, is_left), (where, times, _, missing) in zip(sides, parts, strict=True):
            count = len(where)
            side_late, side_marks = unordered_late[at:at + count], unordered_marks[at:at + count]
            at += count
            record_late(conn, core.view, core.generation, alias, where[side_late],
                        times[side_late], join.bounds[1] if is_left else 0, times[side_late],
                        side_marks[side_late], kind="join",
                        streams=reads[alias].rows.column("stream_id").filter(
                            pa.array(side_late)).to_pylist())
            keep = ~side_late & ~missing
            read = reads[alias]
            out[alias] = feeds[alias].write(conn, read, read.rows.filter(pa.array(keep)), top)
        return out

    def apply(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> None:
        super().apply(conn, batch)
        batch.affected, batch.kept = self._join_partitions(conn, batch.affected,
                                                           batch.watermark)

    def commit(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> BatchResult:
        result = super().commit(conn, batch)
        if batch.kept is not None:
            self._forget(conn, batch.kept, batch.watermark)
        return result

    def _join_partitions(self, conn: psycopg.Connection[Any], affected: set[Partition] | None,
                         watermark: int | None) -> tuple[set[Partition], pa.Table]:
        """The left events to compute this batch (all of them: None), and the left state's
        rows with their times. A left outer join computes a left event once, when its bound
        passed (final): those not final are held back, those that became final added."""
        join = self.join
        state = self.core.states[join.left]
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
        state = self.core.states[alias]
        times, _ = event_times(data_columns(state.typed(conn, raw)).column(column))
        return times

    def _forget(self, conn: psycopg.Connection[Any], left_rows: pa.Table,
                watermark: int | None) -> None:
        """Forget the joined events no event to come can join."""
        join, states = self.join, self.core.states
        if watermark is None:
            return
        if left_rows.num_rows:
            gone = join.forget_left(
                self._kept_times(conn, join.left, left_rows, join.left_time), watermark)
            states[join.left].move_to(
                conn, self.archives[join.left],
                left_rows.column("_position").to_numpy()[gone].tolist())
        right = states[join.right]
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
        join, states = self.join, self.core.states
        lookup = self.core.plan.lookups.get(join.right)
        assert lookup is not None  # noqa: S101 - the plan looks the right side up
        columns = {join.left: lookup.via_column, join.right: lookup.column}
        values: set[str | None] = set()
        for alias, column in columns.items():
            state, archive = states[alias], self.archives[alias]
            archive.move_to(conn, state, column="stream_id", texts=streams)
            values |= set(state.raw_column(conn, state.rows_where(conn, "stream_id", streams),
                                           column))
        values.discard(None)
        if values:
            for alias, column in columns.items():
                self.archives[alias].move_to(conn, states[alias], column=column,
                                             texts=values)
