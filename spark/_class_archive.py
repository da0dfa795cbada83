"""A class-data-sharing archive of the Spark driver JVM, so that a driver starts faster.

A driver JVM loads and verifies some 15,000 classes while it starts. A dynamic CDS archive
holds them already parsed, mapped from one file: on the 2-core machine a local session's start
went from 7.7-8.4 s to 4.9-5.4 s (measured 2026-11-22). Every ``lakefold`` command that starts Spark
pays that start, and so does every restart of a streaming driver after a crash.

JDK 17 writes such an archive only when a JVM exits (``-XX:ArchiveClassesAtExit``). So the first
session that finds no archive starts a detached background process (``python -m
lakefold.spark._class_archive``). That process starts a driver with the same class path, runs
what lakefold's sessions run (``_train``: a Python data source read in batch and as a stream,
an aggregation, a join, the Delta sink and reader, SQL) on a few thousand generated rows,
stops the driver, and waits for the JVM to exit (about 40 s in all). The JVM writes the
archive to a scratch name, which is then renamed into place. Sessions after that pass
``-XX:SharedArchiveFile``. Classes the training did not load are loaded from the jars as usual:
a first streaming replay loaded ~4,900 of them when the training was one small job.

The archive's name is a hash of everything its classes depend on: the ``java`` binary, the
pyspark jars and the session's extra jars. A JVM that still finds it unusable starts as usual,
only without the speed-up. A failed attempt to write it is not repeated for a day.
``LAKEFOLD_CLASS_ARCHIVE=off`` turns all of this off.

Each archive is some 180 MB, and an upgrade of pyspark or Java, another ``spark.jars`` or a new
training makes a new one: a session that maps an archive marks it used (its mtime, at most
hourly), and writing a new archive deletes those unused for ``UNUSED_ARCHIVE_DAYS``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Settings that change the driver's class path; the archive is only valid for the same one.
CLASS_PATH_CONF: Final = ("spark.jars", "spark.driver.extraClassPath")
_QUIET: Final = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a mismatch is not worth a warning
_STALE_LOCK_S: Final = 600.0
_RETRY_FAILED_S: Final = 86_400.0
_DETACH: Final = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)"
_TRAINING: Final = "training 2"  # part of the archive's name: a new training, a new archive
_TRAINING_ROWS: Final = 4_000
UNUSED_ARCHIVE_DAYS: Final = 7
_MARK_USED_S: Final = 3_600.0


def _directory() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lakefold" / "jvm"


def archive_path(conf: Mapping[str, str]) -> Path | None:
    """Where the archive for a driver with ``conf`` lives (None: no ``java`` found)."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java")
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    parts = [_TRAINING, os.path.realpath(java), pyspark.__version__,
             *sorted(p.name for p in jars.glob("*.jar")),
             *(f"{key}={conf.get(key, '')}" for key in CLASS_PATH_CONF)]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _directory() / f"spark-driver-{digest}.jsa"


def driver_options(conf: Mapping[str, str]) -> str:
    """JVM options for a new driver with ``conf``: the archive when there is one (and its
    creation in the background when there is none yet), or nothing."""
    if os.environ.get("LAKEFOLD_CLASS_ARCHIVE", "").lower() in ("0", "off", "false", "no"):
        return ""
    path = archive_path(conf)
    if path is None:
        return ""
    if path.is_file():
        _mark_used(path)
        return f"-XX:SharedArchiveFile={path} {_QUIET}"
    _start_creation(path, conf)
    return ""


def _mark_used(path: Path) -> None:
    try:
        if time.time() - path.stat().st_mtime > _MARK_USED_S:
            os.utime(path)  # read-only files may still have their times set by their owner
    except OSError:
        pass  # another user's archive: it stays, and mapping it works all the same


def prune_unused(directory: Path, *, keep: Path) -> None:
    """Delete the archives in ``directory`` not used for ``UNUSED_ARCHIVE_DAYS``, but ``keep``."""
    cutoff = time.time() - UNUSED_ARCHIVE_DAYS * 86_400
    for archive in directory.glob("spark-driver-*.jsa"):
        try:
            if archive != keep and archive.stat().st_mtime < cutoff:
                archive.unlink()
        except OSError:
            continue


def _start_creation(path: Path, conf: Mapping[str, str]) -> None:
    """Start the background process that writes ``path``, unless one is at work."""
    path.parent.mkdir(parents=True, exist_ok=True)
    failed = path.with_suffix(".failed")
    if failed.exists() and time.time() - failed.stat().st_mtime < _RETRY_FAILED_S:
        return  # the last attempt failed (a JVM without CDS?): not again for a while
    lock = path.with_suffix(".lock")
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)  # its creator died
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    class_path = {key: conf[key] for key in CLASS_PATH_CONF if key in conf}
    # Started through a short-lived intermediate process, so the writer is nobody's child
    # here (no zombie, no Popen left running) and outlives this process in its own session
    # (a kill of this process group spares it).
    subprocess.run(  # noqa: S603 - this interpreter and module, our own arguments
        [sys.executable, "-c", _DETACH, sys.executable, "-m", "lakefold.spark._class_archive",
         str(path), json.dumps(class_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        timeout=60, check=False)
    log.info("writing a class archive of the Spark driver JVM in the background (%s); "
             "later sessions start faster", path)


def create(path: Path, class_path: Mapping[str, str]) -> None:
    """Start a driver that writes its classes to ``path`` at exit, and wait for that exit."""
    from pyspark import SparkContext

    from lakefold.spark._session import spark_session
    from lakefold.spark._source_registry import register_sources

    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    lock = path.with_suffix(".lock")
    try:
        spark = spark_session("local[2]", app_name="lakefold-class-archive", conf={
            **class_path,
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={scratch} {_QUIET}"})
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
