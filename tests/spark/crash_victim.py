"""A streaming projection that the crash test kills with SIGKILL and restarts.

    python -m tests.spark.crash_victim DSN LAKE CHECKPOINT

Reads the event store (``lakefold_events``, 150 positions per micro-batch, availableNow so it
exits when it has caught up) and writes each micro-batch to two Delta tables through the
exactly-once sink: ``events`` (append: one row per event) and ``streams`` (upsert by stream id:
the last position and version seen). Prints ``BATCH <id>`` when a batch starts and ``DONE``
at the end, so the test can kill it in the middle of a batch.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, functions as F

from lakefold.spark import DeltaTarget, WriteMode, register_sources, spark_session, write_batch


def main(dsn: str, lake: str, checkpoint: str) -> None:
    spark = spark_session("local[2]", conf={"spark.sql.shuffle.partitions": "2"},
                          app_name="crash-victim")
    register_sources(spark)
    events = DeltaTarget(f"{lake}/events", app_id="crash@1")
    streams = DeltaTarget(f"{lake}/streams", mode=WriteMode.UPSERT, app_id="crash-streams@1",
                          keys=("stream_id",), order_by="position")

    def project(batch: DataFrame, batch_id: int) -> None:
        sys.stdout.write(f"BATCH {batch_id}\n")
        sys.stdout.flush()
        rows = batch.select("position", "event_id", "stream_id", "stream_version", "type")
        write_batch(rows, events, batch_id)
        latest = rows.select("stream_id", "position", F.col("stream_version").alias("version"))
        write_batch(latest, streams, batch_id)

    query = (
        spark.readStream.format("lakefold_events")
        .option("dsn", dsn)
        .option("maxRecordsPerTrigger", "150")
        .load()
        .writeStream.foreachBatch(project)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sys.stdout.write("DONE\n")
    sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
