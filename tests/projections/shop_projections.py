"""Projections used by the runner tests (a module, as a user would write one)."""

from decimal import Decimal

from pyspark.sql import functions as F

from lakefold.projections import (
    Fold,
    ProjectionOptions,
    changelog,
    delta_table,
    events,
    projection,
    redis_cache,
    search_index,
)

FAST = ProjectionOptions(trigger_seconds=0.2, retries=2, backoff_seconds=0.01,
                         max_records_per_batch=50)


@projection("customer_cache", sources=[changelog("public.customers")],
            target=redis_cache(key="id"), options=FAST)
def customer_cache(customers):
    return customers.select("id", "name", "email", "city", "_position", "_deleted")


@projection("product_search", sources=[changelog("public.products")],
            target=search_index(key="id", text=["name", "description"]), options=FAST)
def product_search(products):
    return products.select("id", "name", "description", F.col("price").cast("double"),
                           "_position", "_deleted")


@projection("price_history", sources=[changelog("public.products")],
            target=delta_table("scd2", keys=["id"]), options=FAST)
def price_history(products):
    return products.select("id", "price", "_ts", "_position", "_deleted")


revenue = Fold("revenue", sources=[events("order", types=["OrderPlaced"])], key="customer",
               schema="customer string, revenue decimal(12,2), orders long",
               target=delta_table("upsert", keys=["customer"]), options=FAST)


@revenue.on("OrderPlaced")
def placed(state, record):
    if record.data.get("poison"):
        raise ValueError(f"poison order at position {record.position}")
    return {**state, "revenue": state.get("revenue", Decimal(0)) + Decimal(record.data["amount"]),
            "orders": state.get("orders", 0) + 1}
