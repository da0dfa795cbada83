"""A projection over an event category that has no events yet (the first hour of a new
system), used by tests/projections/test_new_system.py."""

from pyspark.sql import functions as F

from lakefold.projections import ProjectionOptions, delta_table, events, projection

FAST = ProjectionOptions(trigger_seconds=0.2, max_records_per_batch=50)


@projection("balances", sources=[events("acct")], target=delta_table("upsert", keys=["account"]),
            options=FAST)
def balances(accounts):
    return accounts.select(F.col("stream_id").alias("account"),
                           F.get_json_object("data", "$.amount").cast("long").alias("amount"),
                           "_position")
