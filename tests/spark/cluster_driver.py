"""A projection run against a Spark standalone master (the cluster test's driver process).

    python -m tests.spark.cluster_driver MASTER_URL DSN LAKE CHECKPOINT

Streams the event store through ``lakefold_events`` into a Delta table of per-stream totals
(upsert by stream id), on the cluster's executors, and prints ``APP <id>`` and ``DONE``.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, functions as F

from lakefold.spark import (
    DeltaTarget,
    WriteMode,
    read_delta,
    register_sources,
    spark_session,
    write_batch,
)


def main(master: str, dsn: str, lake: str, checkpoint: str) -> None:
    spark = spark_session(master, app_name="lakefold-cluster-test", conf={
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "1",
        "spark.sql.shuffle.partitions": "2",
    })
    sys.stdout.write(f"APP {spark.sparkContext.applicationId}\n")
    sys.stdout.flush()
    register_sources(spark)
    totals = DeltaTarget(f"{lake}/totals", mode=WriteMode.UPSERT, app_id="totals@1",
                         keys=("stream_id",))

    def project(batch: DataFrame, batch_id: int) -> None:
        counted = batch.groupBy("stream_id").agg(F.count("*").alias("events"),
                                                 F.max("position").alias("last_position"))
        if batch_id > 0:  # running totals: add this batch to what the table holds
            current = read_delta(spark, totals.path).withColumnRenamed("events", "before") \
                .select("stream_id", "before")
            counted = counted.join(current, "stream_id", "left").select(
                "stream_id",
                (F.col("events") + F.coalesce(F.col("before"), F.lit(0))).alias("events"),
                "last_position")
        write_batch(counted, totals, batch_id)

    query = (
        spark.readStream.format("lakefold_events").option("dsn", dsn)
        .option("maxRecordsPerTrigger", "250").load()
        .writeStream.foreachBatch(project)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    sys.stdout.write(f"EXECUTORS {executors}\nDONE\n")
    sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
