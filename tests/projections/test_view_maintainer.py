"""Views kept up to date batch by batch equal the same SQL run on the source at the same
commit, whatever the source does: inserts, updates of join keys and grouping columns, deletes
on either side, rows moving between groups, truncates, several tables in one transaction;
and a chain (a view over a view) too."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections._view_maintainer import ViewMaintainer, open_view, output_stream
from lakefold.projections.exceptions import MissingKeyError
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(900)

ORDER_LINES = """
    SELECT o.id AS order_id, o.customer_id, o.amount, c.city, p.category
    FROM orders o JOIN customers c ON o.customer_id = c.id
    LEFT JOIN products p ON o.product_id = p.id"""
REVENUE_BY_CITY = """
    SELECT city, count(*) AS orders, sum(amount) AS revenue, avg(amount) AS average,
           min(amount) AS smallest, max(amount) AS largest,
           count(DISTINCT customer_id) AS customers
    FROM lines GROUP BY city"""
CUSTOMER_ORDERS = """
    SELECT coalesce(c.id, o.customer_id) AS customer_key, o.id AS order_id, c.name, o.amount
    FROM customers c FULL OUTER JOIN orders o ON c.id = o.customer_id"""

# The same views as SQL on the source: the oracle.
ORACLE: dict[str, tuple[tuple[str, ...], str]] = {
    "order_lines": (("order_id",), ORDER_LINES),
    "revenue_by_city": (("city",), f"""
        SELECT city, count(*) AS orders, sum(amount) AS revenue,
               round(avg(amount), 6) AS average, min(amount) AS smallest,
               max(amount) AS largest, count(DISTINCT customer_id) AS customers
        FROM ({ORDER_LINES}) lines GROUP BY city"""),
    "customer_orders": (("customer_key", "order_id"), CUSTOMER_ORDERS),
}
_CITIES = ("Oslo", "Lima", "Pune", None)
_generations = itertools.count(1)


@pytest.fixture
def shop(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn,
            "CREATE TABLE customers (id int PRIMARY KEY, name text, city text)",
            "CREATE TABLE products (id int PRIMARY KEY, category text)",
            "CREATE TABLE orders (id int PRIMARY KEY, customer_id int, product_id int, "
            "amount numeric(10, 2))",
            "INSERT INTO customers SELECT i, 'c' || i, (ARRAY['Oslo', 'Lima'])[i % 2 + 1] "
            "FROM generate_series(1, 6) i",
            "INSERT INTO products SELECT i, 'k' || (i % 2) FROM generate_series(1, 4) i",
            "INSERT INTO orders SELECT i, i % 7, i % 5, i * 1.25 FROM generate_series(1, 15) i")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("customers", "products", "orders"),
                           slot="views")
    Capture(config).setup()
    capture_now(config)
    return config


def _views(spark: Any, dsn: str) -> dict[str, ViewMaintainer]:
    generation = next(_generations)
    lines = open_view(spark, dsn, view="order_lines", generation=generation,
                      inputs={"orders": "public.orders", "customers": "public.customers",
                              "products": "public.products"},
                      query=ORDER_LINES, key=["order_id"])
    return {
        "order_lines": lines,
        "revenue_by_city": open_view(
            spark, dsn, view="revenue_by_city", generation=generation,
            inputs={"lines": output_stream("order_lines", generation)},
            query=REVENUE_BY_CITY, key=["city"]),
        "customer_orders": open_view(
            spark, dsn, view="customer_orders", generation=generation,
            inputs={"customers": "public.customers", "orders": "public.orders"},
            query=CUSTOMER_ORDERS, key=["customer_key", "order_id"]),
    }


def _rows(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    out = {}
    for row in rows:
        row = {k: (v.quantize(Decimal("0.000001"), ROUND_HALF_UP)
                   if k == "average" and v is not None else v) for k, v in row.items()}
        out[tuple(row[k] for k in keys)] = row
    return out


def _check(dsn: str, views: dict[str, ViewMaintainer]) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        for name, (key, query) in ORACLE.items():
            expected = _rows(cur.execute(query).fetchall(), key)
            view = views[name]
            store = view.connection()
            typed = view.own.typed(store, view.own.rows(store))
            held = _rows(typed.drop_columns([c for c in typed.column_names
                                             if c.startswith("_")]).to_pylist(), key)
            assert held == expected, name


def _step(views: dict[str, ViewMaintainer]) -> None:
    for view in views.values():  # in dependency order: revenue_by_city reads order_lines
        view.step()


_op = st.one_of(
    st.tuples(st.just("order"), st.integers(1, 25), st.integers(0, 8), st.integers(0, 5),
              st.integers(0, 9999)),
    st.tuples(st.just("order_moves"), st.integers(1, 25), st.integers(0, 8)),
    st.tuples(st.just("order_gone"), st.integers(1, 25)),
    st.tuples(st.just("customer"), st.integers(1, 8), st.sampled_from(_CITIES)),
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


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1,
                                max_size=3), min_size=1, max_size=3))
def test_views_equal_the_sql_on_the_source_after_every_batch(
        spark: Any, shop: CaptureConfig, rounds: list[list[list[tuple[Any, ...]]]]) -> None:
    dsn = shop.source_dsn
    views = _views(spark, dsn)
    try:
        _step(views)  # the first batch: everything captured so far
        _check(dsn, views)
        for transactions in rounds:
            for operations in transactions:
                with psycopg.connect(dsn) as conn, conn.transaction():
                    for op in operations:
                        _run(conn, op)
            capture_now(shop)
            _step(views)
            _check(dsn, views)
            assert all(view.step() is None for view in views.values())  # nothing new
    finally:
        for view in views.values():
            view.close()


@pytest.fixture
def shop_views(spark: Any, shop: CaptureConfig) -> Iterator[dict[str, ViewMaintainer]]:
    views = _views(spark, shop.source_dsn)
    yield views
    for view in views.values():
        view.close()


def test_a_batch_writes_only_the_rows_that_changed(
        shop: CaptureConfig, shop_views: dict[str, ViewMaintainer]) -> None:
    dsn, views = shop.source_dsn, shop_views
    _step(views)
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
    _step(views)
    _check(dsn, views)


def test_a_key_that_is_not_unique_stops_the_batch_and_writes_nothing(
        spark: Any, shop: CaptureConfig) -> None:
    dsn = shop.source_dsn
    view = open_view(spark, dsn, view="not_unique", generation=next(_generations),
                     inputs={"orders": "public.orders", "customers": "public.customers"},
                     query="SELECT c.id, o.amount FROM customers c "
                           "JOIN orders o ON o.customer_id = c.id",
                     key=["id"])
    try:
        with pytest.raises(MissingKeyError, match="two output rows have the key"):
            view.step()
        store = view.connection()
        assert view.states["orders"].position(store) == 1  # rolled back: nothing applied
        assert view.own.rows(store).num_rows == 0
    finally:
        view.close()
