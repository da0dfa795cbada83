"""``RECOMPUTE``: a view kept by recomputing, with Spark, the partitions a batch touches.

One batch:

1. **Feed** (``feed``): the event feeds advance; the *cut*, the heads of every input read in
   one statement (``plan._view_cuts``). The capture moves the heads of a source transaction's
   streams in one store transaction, so a cut never holds half of a source transaction: a view
   joining two tables changed together sees both changes or neither.
2. **Apply** each input's records up to the cut to its state, keeping the before- and
   after-images of every changed row; the **affected partitions** (``plan._view_plan``): for a
   direct input, the partition values of its images; for a lookup input, those of the rows its
   images join, looked up in the state of the input it is joined to (already at the cut).
3. **Emit**: those partitions' rows of each input, typed as a changelog read types them,
   become Spark DataFrames named as the view names its inputs; the user's query runs over
   them (a truncate of an input, and the first batch, recompute everything). Diffed against
   the view's own state: rows that changed are upserts, rows of a recomputed partition that
   are gone are deletes, unchanged rows are not written at all.
4. **Commit**: the upserts and deletes appended to the output stream and applied to the view's
   own state, with the cut.

The store transaction makes the batch's effect and its progress (the states' positions) durable
together: a crash anywhere rolls the whole batch back, and the next batch does it again.
Nothing else is needed for exactly-once: targets read the output stream with their own
checkpoints, as they read a captured table.

``WINDOWED``, ``KEPT_AGGREGATE`` and ``INTERVAL_JOIN`` are this operator with one step each
changed (``_windowed``, ``_kept_aggregate``, ``_interval_join``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa

from lakefold.projections.operators._operator import Emitted, ViewOperator
from lakefold.projections.operators._view_core import BatchResult, Partition
from lakefold.projections.operators._view_events import FeedBatch
from lakefold.projections.plan._view_cuts import Cut, record_cut
from lakefold.projections.plan._view_plan import Operator
from lakefold.projections.state._stream_state import StateChanges


@dataclass
class RecomputeBatch:
    """One batch of a recomputing operator, as its steps fill it in."""

    #: What each feed brought (event inputs, a windowed table).
    fed: dict[str, FeedBatch]
    #: The view's watermark after the batch's events (None: no event time).
    watermark: int | None
    #: Each input state's position before the batch.
    starts: dict[str, int]
    cut: Cut
    #: Each input's changes (``apply``).
    changes: dict[str, StateChanges] = field(default_factory=dict)
    #: The partitions to recompute (None: everything).
    affected: set[Partition] | None = None
    #: The partitions recomputed (``emit``; those that failed left out).
    computed: set[Partition] | None = None
    #: Partitions the query failed on, each with its error.
    failed: dict[Partition, str] = field(default_factory=dict)
    emitted: Emitted | None = None
    #: An interval join's left rows (``_interval_join``).
    kept: pa.Table | None = None


class RecomputeOperator(ViewOperator[RecomputeBatch]):
    """Recompute the touched partitions with Spark (see the module docstring)."""

    tag = Operator.RECOMPUTE

    def feed(self, conn: psycopg.Connection[Any], head: int) -> RecomputeBatch | None:
        core = self.core
        fed = self.advance(conn, head)
        starts = {name: state.position(conn) for name, state in core.states.items()}
        cut = core.cut(conn, starts)
        if all(int(cut.heads.get(core.inputs[n], 0)) + 1 <= starts[n] for n in core.inputs) \
                and not any(f.watermark_moved for f in fed.values()):
            record_cut(conn, core.output.name, cut, core.output_head(conn), moved=False,
                       first_commit=None)
            return None
        return RecomputeBatch(fed, self.watermark(fed), starts, cut)

    def advance(self, conn: psycopg.Connection[Any], head: int) -> dict[str, FeedBatch]:
        """Move every feed by what is new (events final up to ``head``)."""
        return {alias: feed.advance(conn, self.core.states[alias], head)
                for alias, feed in self.core.feeds.items()}

    def watermark(self, fed: Mapping[str, FeedBatch]) -> int | None:
        """The view's watermark after the batch's events (None: the view has no event time)."""
        return None

    def apply(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> None:
        core = self.core
        changes = core.apply_states(conn, batch.cut.heads)
        for name, change in changes.items():  # compaction keeps what follows
            core.store.commit_reader(core.owner, core.inputs[name], change.end - 1)
        everything = core.plan.whole or all(s == 1 for s in batch.starts.values()) or any(
            c.truncated for c in changes.values())
        batch.changes = changes
        batch.affected = None if everything else core.affected(conn, changes)

    def emit(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> None:
        if batch.affected is not None and not batch.affected:
            return  # nothing to recompute
        rows = self.rows(conn, batch)
        old = self.core.old_rows(conn, batch.computed)
        batch.emitted = Emitted(*self.core.diff(old, self.finish(rows, batch.watermark)))

    def rows(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> pa.Table:
        """The view's rows of the batch's partitions (noting those computed and failed)."""
        rows, batch.failed, batch.computed = self.core.recompute(conn, batch.affected)
        return rows

    def finish(self, rows: pa.Table, watermark: int | None) -> pa.Table:
        """The rows as the view writes them (``_windowed`` flags the final ones)."""
        return rows

    def commit(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> BatchResult:
        core = self.core
        emitted = batch.emitted
        if emitted is None:
            record_cut(conn, core.output.name, batch.cut, core.output_head(conn), moved=False,
                       first_commit=None)
            return BatchResult(0, 0, 0, (0, 0))
        commit_lsn, commit_ts = core.commit_point(conn, batch.changes)
        positions = core.output.append(conn, core.stream_schema, upserts=emitted.upserts,
                                       old=emitted.previous, deletes=emitted.deletes,
                                       commit_lsn=commit_lsn, commit_ts=commit_ts)
        core.own.apply(conn, positions[1], images=False)
        moved = positions[1] > positions[0]
        record_cut(conn, core.output.name, batch.cut, positions[1] - 1, moved=moved,
                   first_commit=core.first_commit(conn, batch.changes) if moved else None)
        return BatchResult(None if batch.affected is None else len(batch.affected),
                           emitted.upserts.num_rows, emitted.deletes.num_rows, positions,
                           core.named(batch.failed))

    def compute(self, conn: psycopg.Connection[Any]) -> pa.Table:
        return self.core.run_query(conn, None, engine="spark")  # the baseline: Spark's
