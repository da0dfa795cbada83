"""The demo shop: a small schema (customers, products, orders) and a deterministic workload.

Used by ``lakefold demo``, its integration test and the benchmarks, so all of them exercise the
same inserts, updates and deletes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import psycopg
from psycopg import sql

SCHEMA = "shop"

_DDL = [
    sql.SQL("CREATE SCHEMA {}"),
    sql.SQL(
        "CREATE TABLE {}.customers (id bigint PRIMARY KEY, name text NOT NULL, "
        "email text NOT NULL, city text NOT NULL)"
    ),
    sql.SQL(
        "CREATE TABLE {}.products (id bigint PRIMARY KEY, name text NOT NULL, "
        "description text NOT NULL, price numeric(10,2) NOT NULL)"
    ),
    sql.SQL(
        "CREATE TABLE {}.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, "
        "product_id bigint NOT NULL, quantity int NOT NULL, amount numeric(12,2) NOT NULL, "
        "status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    ),
]

_CITIES = ["Lisbon", "Porto", "Berlin", "Lyon", "Oslo", "Turin", "Leeds", "Ghent"]
_WORDS = ["oak", "steel", "linen", "amber", "cobalt", "maple", "slate", "wool", "birch", "clay"]
_KINDS = ["lamp", "chair", "table", "mug", "rug", "shelf", "vase", "stool", "desk", "bowl"]
_FINISHES = ["hand finished", "oiled", "brushed", "waxed", "glazed", "lacquered"]


@dataclass(frozen=True)
class Workload:
    """How much the workload writes. Orders are written in transactions of ``batch`` orders; then
    about a fifth of them change status and amount, and a twentieth are deleted."""

    customers: int = 200
    products: int = 50
    orders: int = 2_000
    batch: int = 50
    seed: int = 7


def create_schema(conn: psycopg.Connection[object]) -> None:
    """Create the shop schema and its three tables (they must not exist yet)."""
    with conn.transaction():
        for statement in _DDL:
            conn.execute(statement.format(sql.Identifier(SCHEMA)))


def _table(name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(name))


def run_workload(
    conn: psycopg.Connection[object],
    workload: Workload,
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write the workload; returns the number of row changes made. ``progress`` gets the number
    of changes after each transaction."""
    rng = random.Random(workload.seed)  # noqa: S311 - a repeatable workload, not secrets
    changes = 0

    def step(count: int) -> None:
        nonlocal changes
        changes += count
        if progress is not None:
            progress(changes)

    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(_table("customers")),
            [(i, f"Customer {i}", f"c{i}@example.com", rng.choice(_CITIES))
             for i in range(1, workload.customers + 1)],
        )
        names = [f"{rng.choice(_WORDS)} {rng.choice(_KINDS)}"
                 for _ in range(workload.products)]
        cur.executemany(  # a description tells of its own product, never of another one
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(_table("products")),
            [(i, name, f"A {name} made to last, {rng.choice(_FINISHES)}",
              Decimal(rng.randint(500, 50_000)) / 100)
             for i, name in enumerate(names, start=1)],
        )
    step(workload.customers + workload.products)

    insert_order = sql.SQL(
        "INSERT INTO {} (id, customer_id, product_id, quantity, amount, status) "
        "SELECT %s, %s, p.id, %s, p.price * %s, 'placed' FROM {} p WHERE p.id = %s"
    ).format(_table("orders"), _table("products"))
    for start in range(1, workload.orders + 1, workload.batch):
        ids = range(start, min(start + workload.batch, workload.orders + 1))
        with conn.transaction(), conn.cursor() as cur:
            rows = []
            for order_id in ids:
                quantity = rng.randint(1, 5)
                rows.append((order_id, rng.randint(1, workload.customers), quantity, quantity,
                             rng.randint(1, workload.products)))
            cur.executemany(insert_order, rows)
        step(len(ids))

    updated = rng.sample(range(1, workload.orders + 1), workload.orders // 5)
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            sql.SQL("UPDATE {} SET status = 'shipped', amount = amount - %s WHERE id = %s")
            .format(_table("orders")),
            [(Decimal(rng.randint(0, 300)) / 100, order_id) for order_id in updated],
        )
    step(len(updated))

    deleted = rng.sample(range(1, workload.orders + 1), workload.orders // 20)
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(sql.SQL("DELETE FROM {} WHERE id = %s").format(_table("orders")),
                        [(order_id,) for order_id in deleted])
    step(len(deleted))
    return changes


def revenue_per_customer(conn: psycopg.Connection[object]) -> list[tuple[int, str, int, Decimal]]:
    """The demo projection computed by SQL on the source: (customer_id, name, orders, revenue),
    ordered by customer_id. The Delta table must equal this."""
    query = sql.SQL(
        "SELECT c.id, c.name, count(o.id)::int, sum(o.amount) FROM {} o JOIN {} c "
        "ON c.id = o.customer_id GROUP BY c.id, c.name ORDER BY c.id"
    ).format(_table("orders"), _table("customers"))
    return [(int(r[0]), str(r[1]), int(r[2]), Decimal(r[3]))  # type: ignore[index]
            for r in conn.execute(query).fetchall()]


#: The demo views ``order_lines`` and ``revenue_by_city`` as SQL on the source (the oracle).
ORDER_LINES_SQL = (
    "SELECT o.id AS order_id, o.customer_id, c.city, p.name AS product, o.amount "
    "FROM shop.orders o JOIN shop.customers c ON o.customer_id = c.id "
    "JOIN shop.products p ON o.product_id = p.id")
REVENUE_BY_CITY_SQL = sql.SQL(
    "SELECT city, count(*) AS orders, sum(amount) AS revenue, round(avg(amount), 6) AS average, "
    "min(amount) AS smallest, max(amount) AS largest, "
    "count(DISTINCT customer_id) AS customers FROM ({}) lines GROUP BY city"
).format(sql.SQL(ORDER_LINES_SQL))
