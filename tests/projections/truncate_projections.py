"""Projections over ``public.customers`` and ``public.products``, one per target and style, for
the TRUNCATE tests (tests/projections/test_truncate.py)."""

from lakefold.projections import (
    Fold,
    ProjectionOptions,
    changelog,
    delta_table,
    projection,
    redis_cache,
    search_index,
)

# Large batches: a truncate, the changes before it and those after it land in one micro-batch.
FAST = ProjectionOptions(trigger_seconds=0.5, retries=2, backoff_seconds=0.01,
                         max_records_per_batch=10_000)


@projection("customer_table", sources=[changelog("public.customers")],
            target=delta_table("upsert", keys=["id"]), options=FAST)
def customer_table(customers):
    return customers.select("id", "name", "city", "_position", "_deleted")


@projection("customer_cache", sources=[changelog("public.customers")],
            target=redis_cache(key="id"), options=FAST)
def customer_cache(customers):
    return customers.select("id", "name", "city", "_deleted")  # no _position: batch positions


@projection("customer_search", sources=[changelog("public.customers")],
            target=search_index(key="id", text=["name"]), options=FAST)
def customer_search(customers):
    return customers.select("id", "name", "city", "_position", "_deleted")


@projection("customer_history", sources=[changelog("public.customers")],
            target=delta_table("scd2", keys=["id"]), options=FAST)
def customer_history(customers):
    return customers.select("id", "name", "city", "_ts", "_position", "_deleted")


@projection("customer_log", sources=[changelog("public.customers")],
            target=delta_table("append"), options=FAST)
def customer_log(customers):
    return customers.select("id", "name", "_type", "_position")


customer_names = Fold("customer_names", sources=[changelog("public.customers")], key="id",
                      schema="id bigint, name string, city string",
                      target=delta_table("upsert", keys=["id"]), options=FAST)


@customer_names.on("insert", "update", "delete")
def _customer(state, record):
    if record.type == "delete":
        return None
    return {**state, "name": record.data["name"], "city": record.data["city"]}


# Two sources in one state: a truncate of one table clears that table's part only.
labels = Fold("labels", sources=[changelog("public.customers"), changelog("public.products")],
              key="id", schema="id bigint, customer string, product string",
              target=redis_cache(key="id", format="json"), options=FAST)


@labels.on("insert", "update", "delete", "truncate")
def _label(state, record):
    column = "customer" if record.source == "customers" else "product"
    value = None if record.type in ("delete", "truncate") else record.data["name"]
    state = {**state, column: value}
    if state.get("customer") is None and state.get("product") is None:
        return None
    return state
