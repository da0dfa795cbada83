"""``WINDOW_FOLD``: a view that is one ``GROUP BY`` over a tumbling or hopping window of one
event input, folded straight from its feed into the groups' aggregates
(``_window_aggregates``): no feed rows, no input state, no Spark.

One batch: the feed classifies and folds its events (``feed``); the windows the watermark
passed are read from the window book to be written final (``apply``); the touched groups' rows
after the fold are diffed against theirs before it (``emit``; the view's own state is not
needed: after every batch a group's row is its aggregates flagged final by that batch's
watermark); ``commit`` appends them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa

from lakefold.projections.definitions._windows import WINDOW_FINAL, Window
from lakefold.projections.operators._operator import Emitted, ViewOperator
from lakefold.projections.operators._view_core import BatchResult, ViewCore, flag_final
from lakefold.projections.operators._view_events import EventFeed, FeedBatch
from lakefold.projections.operators._window_aggregates import WindowAggregates
from lakefold.projections.plan._view_plan import Operator, ViewPlan
from lakefold.projections.state._window_book import (
    close_windows,
    install_window_book,
    open_windows,
)


@dataclass
class FoldBatch:
    """One batch of a folded window view, as its steps fill it in."""

    fed: FeedBatch
    watermark: int | None
    #: The touched groups' rows before and after the batch (``apply``).
    before: pa.Table | None = None
    after: pa.Table | None = None
    emitted: Emitted | None = None


class WindowFoldOperator(ViewOperator[FoldBatch]):
    """Fold a windowed event input into the view's aggregates (see the module docstring)."""

    tag = Operator.WINDOW_FOLD

    @classmethod
    def stateless_input(cls, plan: ViewPlan) -> str | None:
        assert plan.aggregate is not None  # noqa: S101 - the planner folds this aggregate
        return plan.aggregate.input

    def __init__(self, core: ViewCore) -> None:
        super().__init__(core)
        window, plan = core.window, core.plan.aggregate
        assert window is not None and plan is not None  # noqa: S101 - the plan's
        feed = core.feeds[window.input]
        assert isinstance(feed, EventFeed)  # noqa: S101 - the planner folds event inputs
        self.window: Window = window
        self.event_feed = feed
        self.folded = feed.folder = WindowAggregates(core.owner, plan, feed.schema, window.time)

    def create(self, conn: psycopg.Connection[Any]) -> None:
        install_window_book(conn)
        self.folded.create(conn)

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        self.core.forget_window_state(conn)
        with conn.transaction():
            self.folded.drop(conn)

    def feed(self, conn: psycopg.Connection[Any], head: int) -> FoldBatch | None:
        fed = self.event_feed.advance(conn, None, head)
        if not fed.appended and not fed.watermark_moved:
            return None
        top = fed.max_event_time
        return FoldBatch(fed, None if top is None else top - self.window.lateness_us)

    def apply(self, conn: psycopg.Connection[Any], batch: FoldBatch) -> None:
        window, owner = self.window, self.core.owner
        open_windows(conn, owner, batch.fed.windows, None)
        closed = [] if batch.watermark is None else close_windows(
            conn, owner, batch.watermark - window.size_us, by_end=False)
        batch.before, batch.after = self.folded.finish(conn, closed, self._unflagged())

    def emit(self, conn: psycopg.Connection[Any], batch: FoldBatch) -> None:
        assert batch.before is not None and batch.after is not None  # noqa: S101 - applied
        # The view's rows of these groups, as the last batch wrote them: after every batch a
        # group's row is its aggregates flagged final by that batch's watermark (each batch
        # writes the groups it touched and the windows it closed).
        earlier = batch.fed.max_event_time_before
        old = flag_final(self.window, batch.before,
                         None if earlier is None else earlier - self.window.lateness_us)
        batch.emitted = Emitted(*self.core.diff_groups(
            old, flag_final(self.window, batch.after, batch.watermark)))

    def commit(self, conn: psycopg.Connection[Any], batch: FoldBatch) -> BatchResult:
        core, emitted = self.core, batch.emitted
        assert emitted is not None and batch.after is not None  # noqa: S101 - emitted
        positions = core.output.append(conn, core.stream_schema, upserts=emitted.upserts,
                                       old=emitted.previous, deletes=emitted.deletes,
                                       commit_lsn=0,
                                       commit_ts=batch.fed.moment or datetime.now(UTC))
        return BatchResult(batch.after.num_rows, emitted.upserts.num_rows,
                           emitted.deletes.num_rows, positions)

    def compute(self, conn: psycopg.Connection[Any]) -> pa.Table:
        rows = self.folded.all_rows(conn, self._unflagged())
        return flag_final(self.window, rows, self.core.window_watermark(conn))

    def _unflagged(self) -> pa.Schema:
        """The output's schema without ``window_final`` (``flag_final`` adds it)."""
        output = self.core.output_schema()
        return output.remove(output.get_field_index(WINDOW_FINAL))
