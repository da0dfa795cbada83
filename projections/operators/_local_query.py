"""Run a view's ``LocalPlan`` (``plan._local_plan``) with Arrow, in the process: the same rows
Spark would give for the view's query over the same typed input rows, without a Spark job.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from lakefold.projections.plan._local_plan import HashJoin, LocalNode, LocalPlan, Scan, Select


def fits(plan: LocalPlan, inputs: Mapping[str, pa.Table]) -> bool:
    """Whether ``inputs`` have the columns ``plan`` was compiled for, of the same types (not
    after a DDL changed an input: Spark then analyzes the query again)."""
    from pyspark.sql.pandas.types import from_arrow_type

    for scan in plan.scans():
        rows = inputs.get(scan.input)
        if rows is None or rows.column_names != [name for _, name in scan.columns]:
            return False
        for field, kind in zip(rows.schema, scan.kinds, strict=True):
            try:
                if from_arrow_type(field.type).jsonValue() != kind:
                    return False
            except TypeError:  # pyspark's: a type Spark does not read from Arrow
                return False
    return True


def run_local(plan: LocalPlan, inputs: Mapping[str, pa.Table]) -> pa.Table:
    """The view's rows over ``inputs`` (input name → its typed rows), columns named as the
    view names them."""
    rows = _run(plan.root, inputs)
    return pa.table([rows.column(column) for _, column in plan.output],
                    names=[name for name, _ in plan.output])


def _run(node: LocalNode, inputs: Mapping[str, pa.Table]) -> pa.Table:
    if isinstance(node, Scan):
        rows = inputs[node.input]
        return pa.table([rows.column(name) for _, name in node.columns],
                        names=[column for column, _ in node.columns])
    if isinstance(node, Select):
        rows = _run(node.child, inputs)
        return pa.table([rows.column(source) for _, source in node.columns],
                        names=[column for column, _ in node.columns])
    left, right = _run(node.left, inputs), _run(node.right, inputs)
    return _hash_join(node, left, right)


def _hash_join(node: HashJoin, left: pa.Table, right: pa.Table) -> pa.Table:
    joined = left.join(right, keys=[k for k, _ in node.keys],
                       right_keys=[k for _, k in node.keys], join_type=node.kind,
                       coalesce_keys=False, use_threads=False)
    return joined.select([*left.column_names, *right.column_names])
