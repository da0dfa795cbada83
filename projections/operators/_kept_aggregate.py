"""``KEPT_AGGREGATE``: a view that is one ``GROUP BY`` over one input, without a window, kept
by its changes (``_view_aggregates.AggregateState``): each batch's before- and after-images
move the groups' aggregates; no Spark. The rest of a batch is ``_recompute``'s.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pyarrow as pa

from lakefold.projections.operators._recompute import RecomputeBatch, RecomputeOperator
from lakefold.projections.operators._view_aggregates import AggregateState
from lakefold.projections.operators._view_core import ViewCore
from lakefold.projections.plan._view_plan import Operator


class KeptAggregateOperator(RecomputeOperator):
    """Keep the groups' aggregates by the input's changes (see the module docstring)."""

    tag = Operator.KEPT_AGGREGATE

    def __init__(self, core: ViewCore) -> None:
        super().__init__(core)
        plan = core.plan.aggregate
        assert plan is not None  # noqa: S101 - the planner keeps this aggregate
        self.aggregates = AggregateState(core.owner, plan, core.states[plan.input])

    def create(self, conn: psycopg.Connection[Any]) -> None:
        self.aggregates.create(conn)

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            self.aggregates.drop(conn)

    def rows(self, conn: psycopg.Connection[Any], batch: RecomputeBatch) -> pa.Table:
        images = None if batch.affected is None else batch.changes[self.aggregates.plan.input]
        batch.computed = batch.affected
        return self.aggregates.apply(conn, images, self.core.output_schema())
