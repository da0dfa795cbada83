"""The shop of the view tests (its tables: ``conftest.shop``): the user story's three views (a
foreign-key join, a group-by over it, a full outer join) and the same views as SQL on the
source (the oracle)."""

from __future__ import annotations

import itertools
import random
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg

from lakefold.projections.operators._view_core import Engine, output_stream
from lakefold.projections.operators._view_maintainer import ViewMaintainer, open_view

#: The shop's tables and first rows (``conftest.shop`` and the tests that set it up elsewhere).
SHOP_TABLES = (
    "CREATE TABLE customers (id int PRIMARY KEY, name text, city text)",
    "CREATE TABLE products (id int PRIMARY KEY, category text)",
    "CREATE TABLE orders (id int PRIMARY KEY, customer_id int, product_id int, "
    "amount numeric(10, 2))",
    "INSERT INTO customers SELECT i, 'c' || i, (ARRAY['Oslo', 'Lima'])[i % 2 + 1] "
    "FROM generate_series(1, 6) i",
    "INSERT INTO products SELECT i, 'k' || (i % 2) FROM generate_series(1, 4) i",
    "INSERT INTO orders SELECT i, i % 7, i % 5, i * 1.25 FROM generate_series(1, 15) i",
)


def change_shop(dsn: str, rng: random.Random, round_: int) -> None:
    """One transaction over the three tables: orders in, out and moved to another customer,
    a customer moving city."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        for i in range(5):
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                         "SET amount = excluded.amount",
                         (100 + 10 * round_ + i, rng.randrange(1, 7), rng.randrange(1, 5),
                          rng.randrange(1, 999)))
        conn.execute("DELETE FROM orders WHERE id = %s", (rng.randrange(1, 16),))
        conn.execute("UPDATE customers SET city = %s WHERE id = %s",
                     (rng.choice(("Oslo", "Lima", "Pune")), rng.randrange(1, 7)))
        conn.execute("UPDATE orders SET customer_id = %s WHERE id = %s",
                     (rng.randrange(1, 7), rng.randrange(1, 16)))


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

# A self-join (one table as two inputs), a parent/child join of one table with itself, a
# chain over the self-join, a global aggregate and an aggregate of an aggregate.
SAME_CITY = """
    SELECT a.id, count(b.id) AS same_city FROM a JOIN b ON a.city = b.city GROUP BY a.id"""
LATER_ORDERS = """
    SELECT a.id AS first, b.id AS later, b.amount - a.amount AS more
    FROM a JOIN b ON a.customer_id = b.customer_id AND a.id < b.id"""
CITY_SIZES = "SELECT same_city, count(*) AS customers FROM s GROUP BY same_city"
TOTALS = "SELECT 1 AS k, count(*) AS orders, sum(amount) AS revenue FROM orders"
ORDERS_PER_CUSTOMER_HISTOGRAM = """
    SELECT n, count(*) AS customers FROM (
        SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id) per_customer
    GROUP BY n"""

# The same views as SQL on the source: the oracle.
ORACLE: dict[str, tuple[tuple[str, ...], str]] = {
    "order_lines": (("order_id",), ORDER_LINES),
    "revenue_by_city": (("city",), f"""
        SELECT city, count(*) AS orders, sum(amount) AS revenue,
               round(avg(amount), 6) AS average, min(amount) AS smallest,
               max(amount) AS largest, count(DISTINCT customer_id) AS customers
        FROM ({ORDER_LINES}) lines GROUP BY city"""),
    "customer_orders": (("customer_key", "order_id"), CUSTOMER_ORDERS),
    "same_city": (("id",), SAME_CITY.replace("FROM a JOIN b", "FROM customers a JOIN customers b")),
    "later_orders": (("first", "later"), LATER_ORDERS.replace("FROM a JOIN b",
                                                               "FROM orders a JOIN orders b")),
    "city_sizes": (("same_city",), CITY_SIZES.replace(
        "FROM s", f"FROM ({SAME_CITY.replace('FROM a JOIN b', 'FROM customers a JOIN customers b')}"
        ") s")),
    "totals": (("k",), TOTALS),
    "histogram": (("n",), ORDERS_PER_CUSTOMER_HISTOGRAM),
}
CITIES = ("Oslo", "Lima", "Pune", None)
GENERATIONS = itertools.count(1)


def open_views(spark: Any, dsn: str, engine: Engine = "auto") -> dict[str, ViewMaintainer]:
    """The shop's views, recomputing with ``engine`` (``ViewCore.engine``)."""
    generation = next(GENERATIONS)
    lines = open_view(spark, dsn, view="order_lines", generation=generation,
                      inputs={"orders": "public.orders", "customers": "public.customers",
                              "products": "public.products"},
                      query=ORDER_LINES, key=["order_id"], engine=engine)
    views = {
        "order_lines": lines,
        "revenue_by_city": open_view(
            spark, dsn, view="revenue_by_city", generation=generation,
            inputs={"lines": output_stream("order_lines", generation)},
            query=REVENUE_BY_CITY, key=["city"], engine=engine),
        "customer_orders": open_view(
            spark, dsn, view="customer_orders", generation=generation,
            inputs={"customers": "public.customers", "orders": "public.orders"},
            query=CUSTOMER_ORDERS, key=["customer_key", "order_id"], engine=engine),
        "same_city": open_view(
            spark, dsn, view="same_city", generation=generation,
            inputs={"a": "public.customers", "b": "public.customers"},
            query=SAME_CITY, key=["id"], engine=engine),
        "later_orders": open_view(
            spark, dsn, view="later_orders", generation=generation,
            inputs={"a": "public.orders", "b": "public.orders"},
            query=LATER_ORDERS, key=["first", "later"], engine=engine),
        "totals": open_view(spark, dsn, view="totals", generation=generation,
                            inputs={"orders": "public.orders"}, query=TOTALS, key=["k"],
                            engine=engine),
        "histogram": open_view(spark, dsn, view="histogram", generation=generation,
                               inputs={"orders": "public.orders"},
                               query=ORDERS_PER_CUSTOMER_HISTOGRAM, key=["n"], engine=engine),
    }
    views["city_sizes"] = open_view(
        spark, dsn, view="city_sizes", generation=generation,
        inputs={"s": output_stream("same_city", generation)}, query=CITY_SIZES,
        key=["same_city"], engine=engine)
    return views


def keyed(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    out = {}
    for row in rows:
        row = {k: (v.quantize(Decimal("0.000001"), ROUND_HALF_UP)
                   if k == "average" and v is not None else v) for k, v in row.items()}
        out[tuple(row[k] for k in keys)] = row
    return out


def oracle(dsn: str, name: str) -> dict[Any, dict[str, Any]]:
    """View ``name`` as the source computes it now, by key."""
    key, query = ORACLE[name]
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return keyed(cur.execute(query).fetchall(), key)


def check_views(dsn: str, views: dict[str, ViewMaintainer]) -> None:
    """Each view's rows (its own state) equal the oracle's."""
    for name, (key, _) in ORACLE.items():
        view = views[name]
        store = view.connection()
        typed = view.own.typed(store, view.own.rows(store))
        held = keyed(typed.drop_columns([c for c in typed.column_names
                                         if c.startswith("_")]).to_pylist(), key)
        assert held == oracle(dsn, name), name


def step_views(views: dict[str, ViewMaintainer]) -> None:
    for view in views.values():  # in dependency order: revenue_by_city reads order_lines
        view.step()
