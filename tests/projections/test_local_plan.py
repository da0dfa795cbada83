"""The in-process path of a view's recompute (``plan._local_plan``, ``operators._local_query``)
against Spark, the oracle: generated rows (NULL and repeated keys, every key type the path
admits) through every plan shape it admits give the rows Spark gives; every other shape is
left to Spark."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.projections.operators._local_query import fits, run_local
from lakefold.projections.plan._local_plan import LocalPlan, local_plan
from lakefold.projections.plan._plan_trees import plan_tree

SCHEMA_A = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.decimal128(12, 2)),
                      ("t", pa.timestamp("us", tz="UTC")), ("f", pa.float64())])
SCHEMA_B = pa.schema([("k", pa.int64()), ("s", pa.string()), ("d", pa.date32()),
                      ("ok", pa.bool_())])
SCHEMA_C = pa.schema([("s", pa.string()), ("n", pa.int32())])

#: Every shape the in-process path admits.
LOCAL = [
    "SELECT a.k, a.v, b.d FROM a JOIN b ON a.k = b.k",
    "SELECT a.k AS key, b.s AS other, a.t FROM a JOIN b ON b.k = a.k AND a.s = b.s",
    "SELECT a.k, a.s, b.ok FROM a LEFT JOIN b ON a.k = b.k",
    "SELECT a.f, b.k AS bk, b.d FROM a RIGHT JOIN b ON a.s = b.s",
    "SELECT a.k AS ak, b.k AS bk, a.s FROM a FULL OUTER JOIN b ON a.k = b.k",
    "SELECT a.k, b.d, c.n FROM a JOIN b ON a.k = b.k LEFT JOIN c ON b.s = c.s",
    "SELECT * FROM a LEFT JOIN c ON a.s = c.s",
    "SELECT x.k, x.v FROM (SELECT k, v, s FROM a) x JOIN b ON x.k = b.k",
]
#: Shapes Spark computes (arithmetic, functions, non-equal or float keys, mixed key types,
#: filters, aggregates).
SPARK = [
    "SELECT a.k + 1 AS k FROM a",
    "SELECT coalesce(a.k, b.k) AS k FROM a FULL OUTER JOIN b ON a.k = b.k",
    "SELECT a.k FROM a JOIN b ON a.k < b.k",
    "SELECT a.k FROM a JOIN b ON a.f = b.k",
    "SELECT a.k FROM a JOIN c ON a.k = c.n",
    "SELECT a.k FROM a WHERE a.k > 1",
    "SELECT a.s, count(*) AS n FROM a GROUP BY a.s",
    "SELECT a.k FROM a LEFT ANTI JOIN b ON a.k = b.k",
]

_keys = st.one_of(st.none(), st.integers(0, 4))
_texts = st.one_of(st.none(), st.sampled_from(["x", "y", "ü", ""]))


def _rows_a() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(st.fixed_dictionaries({
        "k": _keys, "s": _texts,
        "v": st.one_of(st.none(), st.decimals(-999, 999, places=2)),
        "t": st.one_of(st.none(), st.datetimes(dt.datetime(2000, 1, 1), dt.datetime(2030, 1, 1),
                                                 timezones=st.just(dt.UTC))),
        "f": st.one_of(st.none(), st.floats(-10, 10)),
    }), max_size=12)


def _rows_b() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(st.fixed_dictionaries({
        "k": _keys, "s": _texts,
        "d": st.one_of(st.none(), st.dates(dt.date(2000, 1, 1), dt.date(2030, 1, 1))),
        "ok": st.one_of(st.none(), st.booleans()),
    }), max_size=12)


def _rows_c() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(st.fixed_dictionaries({"s": _texts, "n": st.one_of(st.none(),
                                                                        st.integers(-5, 5))}),
                    max_size=6)


def _plan(spark: Any, query: str, inputs: dict[str, pa.Table]) -> tuple[Any, LocalPlan | None]:
    for name, rows in inputs.items():
        spark.createDataFrame(rows).createOrReplaceTempView(name)
    df = spark.sql(query)
    tree = plan_tree(json.loads(df._jdf.queryExecution().analyzed().toJSON()))
    return df, local_plan(tree)


def _sorted(rows: pa.Table) -> list[tuple[Any, ...]]:
    def norm(value: Any) -> Any:
        if isinstance(value, Decimal):
            return ("d", str(value))
        return (type(value).__name__, value)

    return sorted((tuple(norm(v) for v in row.values()) for row in rows.to_pylist()),
                  key=repr)


def _inputs(a: list[dict[str, Any]], b: list[dict[str, Any]],
            c: list[dict[str, Any]]) -> dict[str, pa.Table]:
    return {"a": pa.Table.from_pylist(a, schema=SCHEMA_A),
            "b": pa.Table.from_pylist(b, schema=SCHEMA_B),
            "c": pa.Table.from_pylist(c, schema=SCHEMA_C)}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(a=_rows_a(), b=_rows_b(), c=_rows_c(), query=st.sampled_from(LOCAL))
def test_the_in_process_path_gives_the_rows_spark_gives(
        spark: Any, a: list[dict[str, Any]], b: list[dict[str, Any]], c: list[dict[str, Any]],
        query: str) -> None:
    inputs = _inputs(a, b, c)
    df, plan = _plan(spark, query, inputs)
    assert plan is not None, query
    assert fits(plan, inputs)
    expected = df.toArrow()
    got = run_local(plan, inputs)
    assert got.column_names == expected.column_names
    assert _sorted(got.cast(expected.schema)) == _sorted(expected), query


@pytest.mark.parametrize("query", SPARK)
def test_other_shapes_are_left_to_spark(spark: Any, query: str) -> None:
    _, plan = _plan(spark, query, _inputs([], [], []))
    assert plan is None


def test_a_plan_does_not_fit_inputs_whose_columns_changed(spark: Any) -> None:
    inputs = _inputs([{"k": 1}], [{"k": 1}], [])
    _, plan = _plan(spark, LOCAL[0], inputs)
    assert plan is not None and fits(plan, inputs)
    added = dict(inputs, a=inputs["a"].append_column("extra", pa.array([1], pa.int64())))
    retyped = dict(inputs, b=inputs["b"].set_column(0, "k", pa.array(["1"], pa.string())))
    assert not fits(plan, added) and not fits(plan, retyped)
    assert not fits(plan, {"a": inputs["a"]})  # an input missing
