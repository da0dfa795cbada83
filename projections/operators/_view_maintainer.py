"""One generation of a view, kept up to date: a batch at a time, in one store transaction.

The maintainer holds what every operator shares (``_view_core``: the inputs' states and feeds,
the output stream, the view's own state) and the operator that executes the plan's tag
(``ViewPlan.operator``, decided once by the planner): ``OPERATORS`` maps each tag to its class.
A batch (``step``) drives the operator through its protocol (``_operator``): feed → apply →
emit → commit, in ONE store transaction, so a batch's effect and its progress are durable
together: a crash anywhere rolls the whole batch back, and the next ``step`` does it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa

from lakefold.projections.definitions._view_api import Query
from lakefold.projections.operators._interval_join import IntervalJoinOperator
from lakefold.projections.operators._kept_aggregate import KeptAggregateOperator
from lakefold.projections.operators._operator import ViewOperator
from lakefold.projections.operators._recompute import RecomputeOperator
from lakefold.projections.operators._view_core import (
    BatchResult,
    Engine,
    ViewCore,
    ViewGeneration,
)
from lakefold.projections.operators._view_events import EventFeed, store_head
from lakefold.projections.operators._window_fold import WindowFoldOperator
from lakefold.projections.operators._windowed import WindowedOperator
from lakefold.projections.plan._view_cuts import forget_cuts, install_view_cuts
from lakefold.projections.plan._view_plan import Operator, analyze, arrow_output, view_frame
from lakefold.store.internals import ChangelogStore, row_schema, stream_meta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The operator class that executes each tag of the plan.
OPERATORS: Mapping[Operator, type[ViewOperator[Any]]] = {
    kind.tag: kind for kind in (RecomputeOperator, WindowedOperator, KeptAggregateOperator,
                                WindowFoldOperator, IntervalJoinOperator)}


class ViewMaintainer(ViewCore):
    """One generation of one view (see the module docstring)."""

    def __init__(self, spark: SparkSession, store_dsn: str, setup: ViewGeneration) -> None:
        kind = OPERATORS[setup.plan.operator]
        super().__init__(spark, store_dsn, setup, stateless=kind.stateless_input(setup.plan))
        self.operator: ViewOperator[Any] = kind(self)

    # ------------------------------------------------------------------ set-up

    def install(self, output_schema: pa.Schema) -> None:
        """Create the input states (with an index per column they are looked up by), the
        output stream, the view's own state and what the operator keeps (idempotent)."""
        conn = self.connection()
        wanted = self.plan.lookup_columns()
        if self.feeds:
            self.store.install()  # a view over events only, where nothing was captured
        for feed in self.feeds.values():
            feed.create(conn)
        for name, state in self.states.items():
            events = isinstance(self.feeds.get(name), EventFeed)
            lookups = (*wanted.get(name, ()), *(("stream_id",) if events else ()),
                       *(self.window.by if self.window and self.window.input == name else ()))
            state.create(conn, lookups)
            # A durable reader: compaction never drops a delete this view has not applied.
            self.store.commit_reader(self.owner, self.inputs[name], state.position(conn) - 1)
        install_view_cuts(conn)
        self.stream_schema = self.output.create(conn, output_schema, self.plan.key)
        self.own.create(conn, self.plan.partition)
        self.operator.create(conn)

    def drop(self) -> None:
        """Delete what this generation keeps in the store: its input states, its own state,
        its event feeds, its output stream and what the operator kept (nothing reads a retired
        generation's stream: the views that read it switched with it)."""
        conn = self.connection()
        for state in (*self.states.values(), self.own):
            state.drop(conn)
        for feed in self.feeds.values():
            feed.drop(conn)
            feed.stream.drop(conn)
        self.output.drop(conn)
        with conn.transaction():
            forget_cuts(conn, self.output.name)
        self.operator.drop(conn)

    # ------------------------------------------------------------------ one batch

    def step(self) -> BatchResult | None:
        """Apply everything up to the inputs' heads as one batch; None when nothing is new."""
        conn = self.connection()
        head = store_head(self.dsn, conn) if any(  # events are final up to here
            isinstance(f, EventFeed) for f in self.feeds.values()) else 0
        operator = self.operator
        with conn.transaction():
            self.lock(conn)
            batch = operator.feed(conn, head)
            if batch is None:
                return None
            operator.apply(conn, batch)
            operator.emit(conn, batch)
            return operator.commit(conn, batch)

    def compute(self) -> pa.Table:
        """The whole view computed from its inputs' current rows (a full recompute, as a
        baseline: ``step`` computes only what a batch touches)."""
        return self.operator.compute(self.connection())


def input_schema(store_dsn: str, stream: str) -> pa.Schema:
    """The Arrow schema of a stream's rows as a view's query sees them (no metadata)."""
    with ChangelogStore(store_dsn) as store:
        return row_schema(store, stream)


def open_view(spark: SparkSession, store_dsn: str, *, view: str, generation: int,
              inputs: Mapping[str, str], query: Query, key: Sequence[str],
              engine: Engine = "auto") -> ViewMaintainer:
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
    maintainer = ViewMaintainer(spark, store_dsn, ViewGeneration(
        view=view, generation=generation, inputs=inputs, query=query, plan=plan,
        engine=engine))
    maintainer.install(arrow_output(view_frame(spark, schemas, query)))
    return maintainer
