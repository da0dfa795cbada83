"""Projections over ``public.customers`` for the compaction tests: a latest-state view (Redis)
and a history view (Delta SCD2)."""

from lakefold.projections import (
    ProjectionOptions,
    changelog,
    delta_table,
    projection,
    redis_cache,
)

FAST = ProjectionOptions(trigger_seconds=0.2, retries=2, backoff_seconds=0.01,
                         max_records_per_batch=40)


@projection("customer_cache", sources=[changelog("public.customers")],
            target=redis_cache(key="id"), options=FAST)
def customer_cache(customers):
    return customers.select("id", "name", "email", "city", "_position", "_deleted")


@projection("customer_history", sources=[changelog("public.customers")],
            target=delta_table("scd2", keys=["id"]), options=FAST)
def customer_history(customers):
    return customers.select("id", "name", "city", "_ts", "_position", "_deleted")


@projection("price_history", sources=[changelog("public.products")],
            target=delta_table("scd2", keys=["id"]), options=FAST)
def price_history(products):
    return products.select("id", "price", "_ts", "_position", "_deleted")
