"""Event-store projections used by the runner tests: one per target and style."""

from decimal import Decimal
from pathlib import Path

from pyspark.sql import functions as F

from lakefold.projections import (
    Fold,
    ProjectionOptions,
    delta_table,
    events,
    projection,
    redis_cache,
    search_index,
)

FAST = ProjectionOptions(trigger_seconds=0.2, retries=2, backoff_seconds=0.01,
                         max_records_per_batch=25)


revenue = Fold("revenue", sources=[events("order", types=["OrderPlaced"])], key="customer",
               schema="customer string, revenue decimal(12,2), orders long",
               target=delta_table("upsert", keys=["customer"]), options=FAST)


@revenue.on("OrderPlaced")
def placed(state, record):
    antidote = record.data.get("antidote")
    if record.data.get("poison") and not (antidote and Path(antidote).exists()):
        raise ValueError(f"poison order at position {record.position}")
    return {**state, "revenue": state.get("revenue", Decimal(0)) + Decimal(record.data["amount"]),
            "orders": state.get("orders", 0) + 1}


@projection("last_order", sources=[events("order")], target=redis_cache(key="customer"),
            options=FAST)
def last_order(orders):
    return orders.select(F.get_json_object("data", "$.customer").alias("customer"),
                         F.col("stream_id").alias("order"),
                         F.get_json_object("data", "$.amount").alias("amount"), "_position")


@projection("order_search", sources=[events("order")],
            target=search_index(key="order", text=["note"]), options=FAST)
def order_search(orders):
    return orders.select(F.col("stream_id").alias("order"),
                         F.get_json_object("data", "$.note").alias("note"),
                         F.get_json_object("data", "$.customer").alias("customer"), "_position")
