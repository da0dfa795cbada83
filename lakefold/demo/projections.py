"""The demo shop's projections, written with ``lakefold.projections``.

Run them with ``lakefold run --projections lakefold/demo/projections.py`` (or the module name
``lakefold.demo.projections``) over a capture of the ``shop`` schema (``lakefold.demo._shop``):

- ``revenue_per_customer``: a per-key fold (Spark-managed state) keyed by customer: the
  customer's name, its number of orders and their total amount, upserted into Delta. It equals
  ``lakefold.demo._shop.revenue_per_customer`` (the same figures computed by SQL on the source).
  A deleted order is removed from its customer's state, which needs the delete to carry the
  order's ``customer_id``: ``ALTER TABLE shop.orders REPLICA IDENTITY FULL`` (without it a
  delete only carries the key, and goes to the dead letters instead of being dropped silently).
  A ``TRUNCATE`` (or ``lakefold capture recover``) of a table reaches each customer as a
  ``truncate`` record that clears that table's part of the state: of orders, the amounts; of
  customers, the name (the row stays hidden until the customer is back).
- ``customer_cache``: every customer as a Redis hash (``get("customer_cache", id)``).
- ``product_search``: products in a Tantivy index, searchable by name and description
  (``lakefold search product_search "oak lamp"``).
- ``price_history``: SCD type 2 history of product prices in Delta (``valid_from``,
  ``valid_to``, ``current``).
- ``order_lines`` (a view): every order with its customer's city and its product's name, a
  join kept equal to the same SQL on the source whatever changes on either side.
- ``revenue_by_city`` (a view over ``order_lines``): orders, revenue, average, smallest,
  largest and distinct customers per city; a customer who moves takes their orders along.
- ``orders_per_minute`` (a view over the application's ``OrderPlaced`` events, see
  ``lakefold.demo._events``): orders and amount per 1-minute tumbling window of event time,
  2 minutes of allowed lateness; a late event corrects its window.
- ``orders_with_city`` (a view over the same events): each order event with its customer's
  city as of the event's commit (``lookup``): a customer who moves later keeps their earlier
  orders' city, and a rebuild gives the same rows.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from lakefold.demo._events import ORDER_PLACED, event_types
from lakefold.projections import (
    Fold,
    ProjectionOptions,
    Record,
    changelog,
    delta_table,
    events,
    lookup,
    projection,
    redis_cache,
    search_index,
    tumbling,
    view,
)

LIVE = ProjectionOptions(trigger_seconds=0.5, max_records_per_batch=50_000)

revenue_per_customer = Fold(
    "revenue_per_customer",
    sources=[changelog("shop.orders"), changelog("shop.customers")],
    key={"orders": "customer_id", "customers": "id"},
    key_column="customer_id",
    schema="customer_id bigint, name string, orders int, revenue decimal(12,2)",
    target=delta_table("upsert", keys=["customer_id"]),
    initial=lambda customer_id: {"customer_id": customer_id, "name": None, "amounts": {}},
    options=LIVE,
)


@revenue_per_customer.on("insert", "update", "delete", "truncate")
def _change(state: dict[str, Any], record: Record) -> dict[str, Any] | None:
    """Keep the customer's name and the amount of each of its orders; the row is hidden
    (``_deleted``) while the customer has no orders or no name, as in the SQL inner join."""
    if record.source == "customers":
        if record.type == "delete":
            return None
        state = {**state, "name": None if record.type == "truncate" else record.data["name"]}
    else:
        amounts = dict(state["amounts"])
        if record.type == "truncate":
            amounts.clear()
        elif record.type == "delete":
            amounts.pop(str(record.data["id"]), None)
        else:
            amounts[str(record.data["id"])] = Decimal(record.data["amount"])
        state = {**state, "amounts": amounts}
    amounts = state["amounts"]
    return {**state, "orders": len(amounts), "revenue": sum(amounts.values(), Decimal(0)),
            "_deleted": not amounts or state["name"] is None}


@projection("customer_cache", sources=[changelog("shop.customers")],
            target=redis_cache(key="id"), options=LIVE)
def customer_cache(customers: Any) -> Any:
    """The latest row of every customer; a deleted customer disappears from the cache."""
    return customers.select("id", "name", "email", "city", "_position", "_deleted")


@projection("product_search", sources=[changelog("shop.products")],
            target=search_index(key="id", text=["name", "description"]), options=LIVE)
def product_search(products: Any) -> Any:
    """Products by name and description; the price is stored (and range-searchable)."""
    from pyspark.sql import functions as F

    return products.select("id", "name", "description",
                           F.col("price").cast("double").alias("price"), "_position",
                           "_deleted")


@projection("price_history", sources=[changelog("shop.products")],
            target=delta_table("scd2", keys=["id"]), options=LIVE)
def price_history(products: Any) -> Any:
    """Every price a product had, with the time it was valid from and to."""
    return products.select("id", "price", "_ts", "_position", "_deleted")


# Views: joins and aggregations kept equal to SQL under updates and deletes (``lakefold.view``).
SHOP = {"orders": changelog("shop.orders"), "customers": changelog("shop.customers"),
        "products": changelog("shop.products")}

order_lines = view(
    "order_lines", inputs=SHOP, key=["order_id"],
    target=delta_table("upsert", keys=["order_id"]),
    query="""SELECT o.id AS order_id, o.customer_id, c.city, p.name AS product, o.amount
             FROM orders o JOIN customers c ON o.customer_id = c.id
             JOIN products p ON o.product_id = p.id""")

revenue_by_city = view(
    "revenue_by_city", inputs={"lines": order_lines}, key=["city"],
    target=delta_table("upsert", keys=["city"]),
    query="""SELECT city, count(*) AS orders, sum(amount) AS revenue,
                    avg(amount) AS average, min(amount) AS smallest, max(amount) AS largest,
                    count(DISTINCT customer_id) AS customers
             FROM lines GROUP BY city""")

# Event time: the application's order events (``lakefold.demo._events``).
PLACED = {"placed": events("order", types=[ORDER_PLACED])}

orders_per_minute = view(
    "orders_per_minute", inputs=PLACED, key=["window_start"],
    target=delta_table("upsert", keys=["window_start"]), registry=event_types(),
    window=tumbling("placed.occurred_at", "1 minute", lateness="2 minutes"),
    query="""SELECT window_start, window_end, count(*) AS orders, sum(amount) AS amount
             FROM placed GROUP BY window_start, window_end""")

orders_with_city = view(
    "orders_with_city", inputs=PLACED, key=["position"],
    target=delta_table("upsert", keys=["position"]), registry=event_types(),
    enrich={"placed": lookup("shop.customers", on="customer_id", columns=["city"])},
    query="SELECT position, order_id, customer_id, city FROM placed")
