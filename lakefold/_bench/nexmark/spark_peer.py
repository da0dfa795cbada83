"""The Spark Structured Streaming peer: each query Spark can maintain, as a streaming query over
the events' Parquet files (a file stream, ``maxFilesPerTrigger=1``: one micro-batch per file,
oldest first, like the windows bench), with an ``availableNow`` trigger.

- Stateless queries and stream-stream inner joins run in append mode into a Parquet file sink;
  q11's session windows in append mode with ``withWatermark`` (the lateness), so Spark emits
  a session once its watermark passed it: those not closed at the end of the input are
  counted apart (``open_not_emitted``), not as wrong.
- q17 (a GROUP BY without a window) runs in update mode into a ``foreachBatch`` sink that keeps
  every batch's updated rows; the result is each group's last update.
- What Spark cannot maintain (no retractions, no distinct aggregates, no window functions on
  streams) is not run: ``Query.spark_note`` says why.

``events_per_s``: the events / seconds from ``start()`` to the query's end, output written.
``state_bytes``: the largest ``memoryUsedBytes`` of the stateful operators in any batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from lakefold._bench.nexmark.generator import SCHEMA
from lakefold._bench.nexmark.queries import Query

_SPARK_TYPES = {pa.int64(): "BIGINT", pa.int8(): "TINYINT", pa.string(): "STRING"}


@dataclass
class PeerRun:
    """One query on a peer: figures, the result, or why it did not run."""

    events_per_s: float | None = None
    seconds: float | None = None
    state_bytes: int | None = None
    result: pa.Table | None = None
    #: Rows a peer leaves out by design (Spark: windows its watermark had not closed).
    watermark_ms: int | None = None
    error: str | None = None
    #: Why the result was not read (the throughput was measured).
    result_error: str | None = None


def _schema() -> str:
    return ", ".join(
        f"`{f.name}` {'TIMESTAMP' if pa.types.is_timestamp(f.type) else _SPARK_TYPES[f.type]}"
        for f in SCHEMA)


def frames(spark: Any, folder: Path) -> SimpleNamespace:
    """``person``, ``auction`` and ``bid`` as streaming frames over one file stream."""
    events = (spark.readStream.schema(_schema()).option("maxFilesPerTrigger", 1)
              .parquet(str(folder)))
    return SimpleNamespace(
        person=events.where("event_type = 0").selectExpr(
            "position", "p_id AS id", "p_name AS name", "p_emailAddress AS emailAddress",
            "p_creditCard AS creditCard", "p_city AS city", "p_state AS state", "dateTime",
            "p_extra AS extra"),
        auction=events.where("event_type = 1").selectExpr(
            "position", "a_id AS id", "a_itemName AS itemName",
            "a_description AS description", "a_initialBid AS initialBid",
            "a_reserve AS reserve", "dateTime", "a_expires AS expires", "a_seller AS seller",
            "a_category AS category", "a_extra AS extra"),
        bid=events.where("event_type = 2").selectExpr(
            "position", "b_auction AS auction", "b_bidder AS bidder", "b_price AS price",
            "b_channel AS channel", "b_url AS url", "dateTime", "b_extra AS extra"))


def _state_bytes(query: Any) -> int:
    return max([sum(int(op.memoryUsedBytes) for op in p.stateOperators)
                for p in query.recentProgress] or [0])


def _watermark_ms(query: Any) -> int | None:
    from datetime import datetime

    marks = [p.eventTime.get("watermark") for p in query.recentProgress
             if p.eventTime and p.eventTime.get("watermark")]
    if not marks:
        return None
    last = datetime.fromisoformat(str(marks[-1]).replace("Z", "+00:00"))
    return round(last.timestamp() * 1000)


def run_query(spark: Any, folder: Path, scratch: Path, query: Query, events: int) -> PeerRun:
    """Run ``query`` on Spark (see the module docstring); a failure is returned as
    ``error``."""
    if query.spark is None:
        return PeerRun(error=query.spark_note)
    out = scratch / f"spark-{query.name}"
    try:
        frame, mode = query.spark(frames(spark, folder))
        writer = frame.writeStream.outputMode(mode).option(
            "checkpointLocation", str(scratch / f"spark-{query.name}-checkpoint")).trigger(
            availableNow=True)
        if mode == "append":
            writer = writer.format("parquet").option("path", str(out))
        else:
            def keep(batch: Any, batch_id: int) -> None:
                from pyspark.sql import functions as F

                batch.withColumn("_batch", F.lit(batch_id)).write.mode("append").parquet(
                    str(out))
            writer = writer.foreachBatch(keep)
        began = time.perf_counter()
        running = writer.start()
        running.awaitTermination()
        elapsed = time.perf_counter() - began
    except Exception as e:  # a peer's failure is reported, not raised
        return PeerRun(error=f"{type(e).__name__}: {str(e).splitlines()[0]}")
    run = PeerRun(events_per_s=round(events / elapsed), seconds=round(elapsed, 3),
                  state_bytes=_state_bytes(running), watermark_ms=_watermark_ms(running))
    table = ds.dataset(str(out), format="parquet").to_table() if out.exists() else None
    if table is not None and mode != "append":
        table = _last_updates(table, query)
    run.result = table
    return run


def _last_updates(table: pa.Table, query: Query) -> pa.Table:
    """Of update-mode output: each group's row (``Query.spark_keys``) from the last batch
    that updated it."""
    keys = list(query.spark_keys)
    rows = sorted(table.to_pylist(), key=lambda r: r["_batch"])
    last = {tuple(r[k] for k in keys): r for r in rows}
    return pa.Table.from_pylist(list(last.values())).select(list(query.columns))


def session(app: str) -> Any:
    """A local Spark session for the peer (2 cores, as the rest of the bench)."""
    from lakefold.projections.operations import RUNNER_SPARK_CONF
    from lakefold.spark import spark_session

    return spark_session("local[2]", conf={
        **RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.numRecentProgressUpdates": "1000000",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}, app_name=app)

