"""Views kept up to date batch by batch equal the same SQL run on the source at the same
commit, whatever the source does: inserts, updates of join keys and grouping columns, deletes
on either side, rows moving between groups, truncates, several tables in one transaction;
and a chain (a view over a view) too."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg import sql

from lakefold.capture import CaptureConfig
from lakefold.projections.exceptions import MissingKeyError
from lakefold.projections.operators._view_core import Engine
from lakefold.projections.operators._view_maintainer import ViewMaintainer, open_view
from tests.capture.conftest import capture_now, execute
from tests.projections.view_shop import (
    CITIES,
    GENERATIONS,
    check_views,
    open_views,
    step_views,
)

pytestmark = pytest.mark.timeout(900)

_op = st.one_of(
    st.tuples(st.just("order"), st.integers(1, 25), st.integers(0, 8), st.integers(0, 5),
              st.integers(0, 9999)),
    st.tuples(st.just("order_moves"), st.integers(1, 25), st.integers(0, 8)),
    st.tuples(st.just("order_gone"), st.integers(1, 25)),
    st.tuples(st.just("customer"), st.integers(1, 8), st.sampled_from(CITIES)),
    st.tuples(st.just("customer_rekey"), st.integers(1, 8), st.integers(1, 8)),
    st.tuples(st.just("customer_gone"), st.integers(1, 8)),
    st.tuples(st.just("product"), st.integers(1, 5), st.sampled_from(("k0", "k1", None))),
    st.tuples(st.just("product_gone"), st.integers(1, 5)),
    st.tuples(st.just("truncate"), st.sampled_from(("orders", "customers", "products"))),
)


def _run(conn: psycopg.Connection[Any], op: tuple[Any, ...]) -> None:
    kind, *args = op
    statements = {
        "order": "INSERT INTO orders VALUES (%s, %s, %s, %s / 100.0) ON CONFLICT (id) DO "
                 "UPDATE SET customer_id = excluded.customer_id, "
                 "product_id = excluded.product_id, amount = excluded.amount",
        "order_moves": "UPDATE orders SET customer_id = %s WHERE id = %s",
        "order_gone": "DELETE FROM orders WHERE id = %s",
        "customer": "INSERT INTO customers VALUES (%s, 'n', %s) ON CONFLICT (id) DO UPDATE "
                    "SET city = excluded.city",
        "customer_rekey": "UPDATE customers SET id = %s WHERE id = %s AND NOT EXISTS "
                          "(SELECT FROM customers WHERE id = %s)",
        "customer_gone": "DELETE FROM customers WHERE id = %s",
        "product": "INSERT INTO products VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                   "SET category = excluded.category",
        "product_gone": "DELETE FROM products WHERE id = %s",
    }
    if kind == "truncate":
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(args[0])))
    elif kind == "order_moves":
        conn.execute(statements[kind], (args[1], args[0]))
    elif kind == "customer_rekey":
        conn.execute(statements[kind], (args[1], args[0], args[1]))
    else:
        conn.execute(statements[kind], args)


@pytest.mark.parametrize("engine", ["auto", "spark"])
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1,
                                max_size=3), min_size=1, max_size=3))
def test_views_equal_the_sql_on_the_source_after_every_batch(
        spark: Any, shop: CaptureConfig, engine: Engine,
        rounds: list[list[list[tuple[Any, ...]]]]) -> None:
    """Every path of a recompute against the oracle: in the process where the plan allows it
    ("auto": the join of ``order_lines`` never starts a Spark job), and Spark for all."""
    dsn = shop.source_dsn
    views = open_views(spark, dsn, engine)
    try:
        step_views(views)  # the first batch: everything captured so far
        check_views(dsn, views)
        for transactions in rounds:
            for operations in transactions:
                with psycopg.connect(dsn) as conn, conn.transaction():
                    for op in operations:
                        _run(conn, op)
            capture_now(shop)
            step_views(views)
            check_views(dsn, views)
            assert all(view.step() is None for view in views.values())  # nothing new
        lines = views["order_lines"]
        assert lines.plan.local is not None and views["later_orders"].plan.local is None
        assert lines.last_engine == ("local" if engine == "auto" else "spark")
    finally:
        for view in views.values():
            view.close()


def test_a_batch_writes_only_the_rows_that_changed(
        shop: CaptureConfig, shop_views: dict[str, ViewMaintainer]) -> None:
    dsn, views = shop.source_dsn, shop_views
    step_views(views)
    lines, revenue = views["order_lines"], views["revenue_by_city"]
    execute(dsn, "UPDATE customers SET city = 'Pune' WHERE id = 3")  # orders 3 and 10
    capture_now(shop)
    moved = lines.step()
    assert moved is not None and (moved.partitions, moved.upserts, moved.deletes) == (2, 2, 0)
    by_city = revenue.step()
    assert by_city is not None and by_city.upserts == 2  # Pune appears, Lima shrinks
    execute(dsn, "UPDATE customers SET name = 'same city' WHERE id = 3")
    capture_now(shop)
    unchanged = lines.step()
    assert unchanged is not None and (unchanged.upserts, unchanged.deletes) == (0, 0)
    assert revenue.step() is None  # nothing reached it
    step_views(views)
    check_views(dsn, views)


def test_a_key_the_plan_shows_is_not_unique_is_refused_before_anything_runs(
        spark: Any, shop: CaptureConfig) -> None:
    with pytest.raises(MissingKeyError, match="key \\[id\\] may hold several rows"):
        open_view(spark, shop.source_dsn, view="not_unique", generation=next(GENERATIONS),
                  inputs={"orders": "public.orders", "customers": "public.customers"},
                  query="SELECT c.id, o.amount FROM customers c "
                        "JOIN orders o ON o.customer_id = c.id",
                  key=["id"])


def test_a_key_that_is_not_unique_stops_the_batch_and_writes_nothing(
        spark: Any, shop: CaptureConfig) -> None:
    dsn = shop.source_dsn
    # a union: the plan cannot tell whether its branches share keys, the rows do
    view = open_view(spark, dsn, view="not_unique", generation=next(GENERATIONS),
                     inputs={"orders": "public.orders", "customers": "public.customers"},
                     query="SELECT id, amount FROM orders UNION ALL "
                           "SELECT id, 0 AS amount FROM customers",
                     key=["id"])
    try:
        with pytest.raises(MissingKeyError, match="two output rows have the key"):
            view.step()
        store = view.connection()
        assert view.states["orders"].position(store) == 1  # rolled back: nothing applied
        assert view.own.rows(store).num_rows == 0
    finally:
        view.close()


def test_partitions_the_query_fails_on_are_left_out_and_the_rest_progress(
        spark: Any, shop: CaptureConfig) -> None:
    dsn = shop.source_dsn
    view = open_view(spark, dsn, view="ratios", generation=next(GENERATIONS),
                     inputs={"orders": "public.orders"},
                     query="SELECT id AS order_id, 100 / (amount - 2.50) AS ratio "
                           "FROM orders", key=["order_id"])
    try:
        first = view.step()  # order 2 has amount 2.50: a division by zero
        assert first is not None
        assert [(p, "DIVIDE_BY_ZERO" in e) for p, e in first.failed] == [({"order_id": "2"},
                                                                         True)]
        store = view.connection()
        held = {r["order_id"] for r in view.own.typed(store, view.own.rows(store)).to_pylist()}
        assert held == set(range(1, 16)) - {2}
        execute(dsn, "UPDATE orders SET amount = 2.75 WHERE id IN (2, 3)",
                "UPDATE orders SET amount = 2.50 WHERE id = 4")
        capture_now(shop)
        second = view.step()
        assert second is not None
        assert [p for p, _ in second.failed] == [{"order_id": "4"}]
        rows = {r["order_id"]: r["ratio"]
                for r in view.own.typed(store, view.own.rows(store)).to_pylist()}
        assert set(rows) == set(range(1, 16))  # order 2 is back
        assert rows[2] == 400 and rows[4] == 40  # order 4 keeps its row of before
    finally:
        view.close()
