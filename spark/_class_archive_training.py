"""The training run that writes the Spark driver's class archive (see ``_class_archive``).

``_class_archive`` starts ``python -m lakefold.spark._class_archive_training PATH CLASS_PATH`` in
the background when a session finds no archive. This process starts a driver that writes its
classes to PATH when its JVM exits, runs what lakefold's sessions run (``_train``) on a few
thousand generated rows, stops the driver and waits for the JVM to exit.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from lakefold.spark._class_archive import QUIET, prune_unused
from lakefold.spark._session import spark_session
from lakefold.spark._source_registry import register_sources

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_TRAINING_ROWS: Final = 4_000


def create(path: Path, class_path: Mapping[str, str]) -> None:
    """Start a driver that writes its classes to ``path`` at exit, and wait for that exit."""
    from pyspark import SparkContext

    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    lock = path.with_suffix(".lock")
    try:
        spark = spark_session("local[2]", app_name="lakefold-class-archive", conf={
            **class_path,
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={scratch} {QUIET}"})
        register_sources(spark)
        with tempfile.TemporaryDirectory(prefix="lakefold-class-archive-") as scratch_dir:
            _train(spark, Path(scratch_dir))
        gateway = SparkContext._gateway
        spark.stop()
        if gateway is not None:
            process = gateway.proc
            gateway.shutdown()
            process.stdin.close()  # the JVM exits at the end of its input, writing the archive
            if process.wait(timeout=300) == 0 and scratch.is_file():
                scratch.replace(path)
                prune_unused(path.parent, keep=path)
    finally:
        if not path.is_file():
            path.with_suffix(".failed").touch()
        scratch.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


class TrainingSource(DataSource):
    """Generated rows (``position``, ``key``, ``value``, a ``data`` struct) for ``_train``, in
    batch and as a stream with a read limit, as lakefold's store sources deliver them."""

    @classmethod
    def name(cls) -> str:
        return "lakefold_class_archive_training"

    def schema(self) -> str:
        return "position bigint, key string, value bigint, data struct<name: string, n: bigint>"

    def reader(self, schema: Any) -> DataSourceReader:
        return _TrainingReader()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _TrainingStreamReader()


def _training_rows(start: int, end: int) -> Iterator[pa.RecordBatch]:
    positions = pa.array(range(start, end), pa.int64())
    keys = pa.array([f"k{p % 50}" for p in range(start, end)])
    yield pa.RecordBatch.from_arrays(
        [positions, keys, pa.array([p % 7 for p in range(start, end)], pa.int64()),
         pa.StructArray.from_arrays([keys, positions], names=["name", "n"])],
        names=["position", "key", "value", "data"])


class _TrainingReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        half = _TRAINING_ROWS // 2
        return [InputPartition((0, half)), InputPartition((half, _TRAINING_ROWS))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _training_rows(*partition.value)


class _TrainingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def initialOffset(self) -> dict[str, int]:
        return {"position": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(_TRAINING_ROWS // 4)

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else _TRAINING_ROWS
        return {"position": min(start["position"] + rows, _TRAINING_ROWS)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition((start["position"], end["position"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _training_rows(*partition.value)


def _train(spark: SparkSession, scratch: Path) -> None:
    """Run, on generated rows, what lakefold's sessions run, so its classes are archived."""
    from pyspark.sql import functions as F

    from lakefold.spark._delta_read import read_delta
    from lakefold.spark._delta_sink import write_batch
    from lakefold.spark._delta_target import DeltaTarget, WriteMode

    spark.dataSource.register(TrainingSource)
    source = TrainingSource.name()
    spark.read.format(source).load().groupBy("key").agg(
        F.count("*"), F.sum("data.n"), F.max("position")).collect()
    target = DeltaTarget(str(scratch / "table"), mode=WriteMode.UPSERT, app_id="training@1",
                         keys=("key",), order_by="position")

    def fold(batch: DataFrame, batch_id: int) -> None:
        totals = batch.groupBy("key").agg(F.max("position").alias("position"),
                                          F.sum("value").alias("value"))
        if batch_id:
            before = read_delta(spark, target.path).select("key", F.col("value").alias("v0"))
            totals = totals.join(before, "key", "left").select(
                "key", "position", (F.col("value") + F.coalesce("v0", F.lit(0))).alias("value"))
        write_batch(totals, target, batch_id)

    query = (spark.readStream.format(source).load().writeStream.foreachBatch(fold)
             .option("checkpointLocation", str(scratch / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    read_delta(spark, target.path).createOrReplaceTempView("training")
    spark.sql("SELECT key, value FROM training ORDER BY value DESC LIMIT 3").collect()


if __name__ == "__main__":
    os.environ["LAKEFOLD_CLASS_ARCHIVE"] = "off"  # no archive options for the creating driver
    create(Path(sys.argv[1]), json.loads(sys.argv[2]))
