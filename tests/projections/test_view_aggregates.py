"""Aggregates kept by their changes (``_view_aggregates``): which views qualify, and the values
they compute equal Spark's own (the average's rounding) and PostgreSQL's, whatever the batch
does to a group: rows arriving, leaving, moving between groups, the extreme value deleted, the
last row of a group gone, NULLs."""

from __future__ import annotations

import itertools
import math
import random
from decimal import Decimal, localcontext
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections.operators._view_aggregates import spark_average
from lakefold.projections.operators._view_maintainer import open_view
from lakefold.projections.plan._view_plan import Operator, analyze
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(600)
LINES = "order_id bigint, customer_id bigint, city string, note string, amount decimal(12,2)"


@pytest.mark.parametrize(("query", "kept"), [
    ("SELECT city, count(*) AS n, sum(amount) AS s, avg(amount) AS a, min(amount) AS lo, "
     "max(note) AS hi, count(DISTINCT customer_id) AS d, count(note) AS c FROM lines "
     "GROUP BY city", True),
    ("SELECT city, round(avg(amount), 2) AS a FROM lines GROUP BY city", False),
    ("SELECT city, sum(amount) AS s FROM lines WHERE amount > 0 GROUP BY city", False),
    ("SELECT city, sum(amount) FILTER (WHERE amount > 0) AS s FROM lines GROUP BY city", False),
    ("SELECT city, sum(amount * 2) AS s FROM lines GROUP BY city", False),
    ("SELECT city, collect_set(note) AS notes FROM lines GROUP BY city", False),
    ("SELECT city, count(*) AS n FROM lines GROUP BY city HAVING count(*) > 1", False),
])
def test_which_views_are_kept_by_their_changes(spark: Any, query: str, kept: bool) -> None:
    plan = analyze(spark, "v", {"lines": LINES}, query, ["city"])
    assert (plan.aggregate is not None) == kept
    assert ("aggregates kept by their changes" in plan.describe()) == kept


@pytest.mark.parametrize(("precision", "scale"), [(12, 2), (5, 0), (10, 4), (28, 6), (3, 3)])
def test_the_average_rounds_as_spark_rounds_it(spark: Any, precision: int, scale: int) -> None:
    """Sixty groups of random values of one decimal type, edge values among them, averaged by
    Spark in one job and by ``spark_average`` from the exact sum and the count."""
    rng = random.Random(precision * 100 + scale)
    top = 10 ** precision - 1
    edges = [top, -top, 1, -1, 0, top // 2, 5, -5]

    def value() -> Decimal:
        digits = rng.choice(edges) if rng.random() < 0.3 else rng.randint(-top, top)
        return Decimal(digits).scaleb(-scale)

    groups = {g: [value() for _ in range(rng.randint(1, 9))] for g in range(60)}
    frame = spark.createDataFrame([(g, v) for g, vs in groups.items() for v in vs],
                                  f"g int, x decimal({precision},{scale})")
    expected = {r["g"]: r["a"] for r in frame.groupBy("g").agg({"x": "avg"})
                .withColumnRenamed("avg(x)", "a").collect()}
    with localcontext(prec=100):
        mine = {g: spark_average(sum(vs, Decimal(0)), len(vs), precision, scale)
                for g, vs in groups.items()}
    assert mine == expected


ITEMS_VIEW = """
    SELECT grp, count(*) AS n, count(price) AS priced, sum(qty) AS qty, avg(qty) AS avg_qty,
           sum(price) AS revenue, avg(price) AS avg_price, min(price) AS cheapest,
           max(label) AS last_label, count(DISTINCT label) AS labels
    FROM items GROUP BY grp"""
ITEMS_ORACLE = """
    SELECT grp, count(*) AS n, count(price) AS priced, sum(qty) AS qty, avg(qty) AS avg_qty,
           sum(price) AS revenue, round(avg(price), 6) AS avg_price, min(price) AS cheapest,
           max(label COLLATE "C") AS last_label, count(DISTINCT label) AS labels
    FROM items GROUP BY grp"""
GENERATIONS = itertools.count(1)
_item = st.one_of(
    st.tuples(st.just("put"), st.integers(1, 12), st.sampled_from(("a", "b", "c", None)),
              st.integers(-50, 50), st.one_of(st.none(), st.decimals(
                  min_value=-999, max_value=999, places=2, allow_nan=False)),
              st.sampled_from(("x", "y", "Z", "é", "", None))),
    st.tuples(st.just("move"), st.integers(1, 12), st.sampled_from(("a", "b", None))),
    st.tuples(st.just("gone"), st.integers(1, 12)),
    st.tuples(st.just("truncate")),
)


@pytest.fixture
def items(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn, "CREATE TABLE items (id int PRIMARY KEY, grp text, qty int, "
            "price numeric(8, 2), label text)",
            "INSERT INTO items SELECT i, (ARRAY['a', 'b'])[i % 2 + 1], i, i * 1.5, 'x' || i % 3 "
            "FROM generate_series(1, 6) i")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("items",), slot="aggregates")
    Capture(config).setup()
    capture_now(config)
    return config


def _apply(conn: psycopg.Connection[Any], op: tuple[Any, ...]) -> None:
    if op[0] == "put":
        conn.execute("INSERT INTO items VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                     "SET grp = excluded.grp, qty = excluded.qty, price = excluded.price, "
                     "label = excluded.label", op[1:])
    elif op[0] == "move":
        conn.execute("UPDATE items SET grp = %s WHERE id = %s", (op[2], op[1]))
    elif op[0] == "gone":
        conn.execute("DELETE FROM items WHERE id = %s", (op[1],))
    else:
        conn.execute("TRUNCATE items")


def _same(held: dict[Any, dict[str, Any]], expected: dict[Any, dict[str, Any]]) -> None:
    assert held.keys() == expected.keys()
    for grp, row in expected.items():
        mine = dict(held[grp])
        want = {**row, "avg_qty": None if row["avg_qty"] is None else float(row["avg_qty"])}
        assert math.isclose(mine.pop("avg_qty") or 0, want.pop("avg_qty") or 0, rel_tol=1e-12)
        assert mine == want, grp


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(st.lists(st.lists(_item, min_size=1, max_size=6), min_size=1,
                                max_size=2), min_size=1, max_size=4))
def test_an_aggregate_kept_by_its_changes_equals_the_sql_after_every_batch(
        spark: Any, items: CaptureConfig, rounds: list[list[list[tuple[Any, ...]]]]) -> None:
    dsn = items.source_dsn
    view = open_view(spark, dsn, view="by_group", generation=next(GENERATIONS),
                     inputs={"items": "public.items"}, query=ITEMS_VIEW, key=["grp"])
    assert view.plan.operator is Operator.KEPT_AGGREGATE  # the cheap path, not a recompute

    def check() -> None:
        store = view.connection()
        typed = view.own.typed(store, view.own.rows(store))
        held = {r["grp"]: {k: v for k, v in r.items() if not k.startswith("_")}
                for r in typed.to_pylist()}
        with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as c:
            expected = {r["grp"]: r for r in c.execute(ITEMS_ORACLE).fetchall()}
        _same(held, expected)
        # the state's output is the one Spark computes over the same rows, value for value
        spark_rows = {r["grp"]: r for r in view.compute().to_pylist()}
        _same(held, {g: {**r, "avg_qty": r["avg_qty"]} for g, r in spark_rows.items()})

    try:
        view.step()
        check()
        for transactions in rounds:
            for operations in transactions:
                with psycopg.connect(dsn) as conn, conn.transaction():
                    for op in operations:
                        _apply(conn, op)
            capture_now(items)
            view.step()
            check()
    finally:
        view.close()
