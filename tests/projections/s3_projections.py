"""Projections whose Delta tables live in the test's bucket (tests/projections/
test_object_store.py): one per Delta mode, over the ``order`` events of helpers.append_orders."""

from pyspark.sql import functions as F

from lakefold.projections import Fold, ProjectionOptions, delta_table, events, projection

FAST = ProjectionOptions(trigger_seconds=0.2, retries=2, backoff_seconds=0.01,
                         max_records_per_batch=6)

revenue = Fold("revenue", sources=[events("order", types=["OrderPlaced"])], key="customer",
               schema="customer string, revenue decimal(12,2), orders long",
               target=delta_table("upsert", keys=["customer"]), options=FAST)


@revenue.on("OrderPlaced")
def placed(state, record):
    from decimal import Decimal

    return {**state, "revenue": state.get("revenue", Decimal(0)) + Decimal(record.data["amount"]),
            "orders": state.get("orders", 0) + 1}


@projection("order_log", sources=[events("order")], target=delta_table("append"), options=FAST)
def order_log(orders):
    return orders.select(F.col("stream_id").alias("order"),
                         F.get_json_object("data", "$.customer").alias("customer"),
                         F.get_json_object("data", "$.amount").alias("amount"), "_position")


@projection("last_amount", sources=[events("order")],
            target=delta_table("scd2", keys=["customer"]), options=FAST)
def last_amount(orders):
    return orders.select(F.get_json_object("data", "$.customer").alias("customer"),
                         F.get_json_object("data", "$.amount").alias("amount"),
                         "_ts", "_position")
