"""The projections the console tests run (a module, as a user would write one): a Redis cache
of customers, a fold over order events that dead-letters poison orders until their antidote
file exists, and two views (customers' cities, and a count per city that reads it)."""

import os
from decimal import Decimal

from lakefold.projections import (
    Fold,
    ProjectionOptions,
    changelog,
    delta_table,
    events,
    projection,
    redis_cache,
    view,
)

FAST = ProjectionOptions(trigger_seconds=0.3, retries=1, backoff_seconds=0.01)


@projection("customer_cache", sources=[changelog("public.customers")],
            target=redis_cache(key="id"), options=FAST)
def customer_cache(customers):
    return customers.select("id", "name", "city", "_position", "_deleted")


revenue = Fold("revenue", sources=[events("order", types=["OrderPlaced"])], key="customer",
               schema="customer string, revenue decimal(12,2), orders long",
               target=delta_table("upsert", keys=["customer"]), options=FAST)


@revenue.on("OrderPlaced")
def placed(state, record):
    antidote = record.data.get("poison")
    if antidote and not os.path.exists(antidote):
        raise ValueError(f"poison order at position {record.position}")
    return {**state, "revenue": state.get("revenue", Decimal(0)) + Decimal(record.data["amount"]),
            "orders": state.get("orders", 0) + 1}


customer_cities = view("customer_cities", inputs={"customers": changelog("public.customers")},
                       key=["id"], target=delta_table("upsert", keys=["id"]),
                       query="SELECT id, city FROM customers")
city_counts = view("city_counts", inputs={"cities": customer_cities}, key=["city"],
                   target=delta_table("upsert", keys=["city"]),
                   query="SELECT city, count(*) AS customers FROM cities GROUP BY city")
