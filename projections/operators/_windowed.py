"""``WINDOWED``: a view over a window of one input (tumbling, hopping or session; an event
input's feed or a table's time column), kept by recomputing the touched partitions
(``_recompute``) and the partitions of the windows the watermark passed, whose rows are then
written final (``window_final``; with ``emit='final'`` only those).

The watermark is the windowed input's largest event time minus the allowed lateness; the
windows the events fell in are noted open in the window book (``state._window_book``) and read
back when the watermark passes their end (a session's end is its last event's plus the gap).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
import pyarrow as pa

from lakefold.projections.definitions._windows import TIME_TYPE, WINDOW_START, Window
from lakefold.projections.operators._recompute import RecomputeBatch, RecomputeOperator
from lakefold.projections.operators._view_core import Partition, ViewCore, flag_final
from lakefold.projections.operators._view_events import FeedBatch
from lakefold.projections.plan._view_plan import Operator
from lakefold.projections.state._window_book import (
    close_windows,
    install_window_book,
    open_windows,
)
from lakefold.store.internals import column_for, text_array


class WindowedOperator(RecomputeOperator):
    """Recompute the touched partitions and the windows the watermark passed (see the module
    docstring)."""

    tag = Operator.WINDOWED

    def __init__(self, core: ViewCore) -> None:
        super().__init__(core)
        assert core.window is not None  # noqa: S101 - the planner tags windowed views only
        self.window: Window = core.window

    def create(self, conn: psycopg.Connection[Any]) -> None:
        install_window_book(conn)

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        self.core.forget_window_state(conn)

    def watermark(self, fed: Mapping[str, FeedBatch]) -> int | None:
        top = fed[self.window.input].max_event_time
        return None if top is None else top - self.window.lateness_us

    def apply(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> None:
        super().apply(conn, batch)
        closing = self._close_windows(conn, batch.fed[self.window.input], batch.watermark,
                                      find=batch.affected is not None)
        if batch.affected is not None:
            batch.affected |= closing

    def finish(self, rows: pa.Table, watermark: int | None) -> pa.Table:
        return flag_final(self.window, rows, watermark)

    def compute(self, conn: psycopg.Connection[Any]) -> pa.Table:
        return flag_final(self.window, super().compute(conn), self.core.window_watermark(conn))

    def _close_windows(self, conn: psycopg.Connection[Any], fed: FeedBatch,
                       watermark: int | None, *, find: bool) -> set[Partition]:
        """Note the windows the batch's events fell in as open; return the partitions of the
        windows the watermark passed (recomputed to write their rows final), when ``find``
        (not when the batch recomputes everything anyway)."""
        window, core = self.window, self.core
        sessions = window.kind == "session"
        open_windows(conn, core.owner, fed.windows, fed.ends if sessions else None)
        if watermark is None:
            return set()
        closed = close_windows(conn, core.owner, watermark if sessions else
                               watermark - window.size_us, by_end=sessions)
        if not closed or not find:
            return set()
        starts = pa.array(closed, pa.int64()).cast(TIME_TYPE)
        values = text_array(column_for(pa.field(WINDOW_START, TIME_TYPE), key=True),
                            starts).to_pylist()
        rows = core.states[window.input].rows_where(conn, WINDOW_START, values)
        return core.partitions_of(conn, window.input, [rows])
