"""delta-spark, the Delta Lake project's own Spark connector, on a lakefold session (opt-in).

lakefold writes every Delta table with delta-rs and reads it into Spark through the snapshot's
file list (``_delta_read``). delta-spark adds ``spark.read.format("delta")``, Delta SQL
(``OPTIMIZE``, ``VACUUM``, ``DESCRIBE HISTORY``, time travel in SQL) and the reader features
lakefold's file-list reader refuses (deletion vectors, column mapping). It is a JVM library:
its jars go on the driver's class path through ``spark.jars`` when the session starts, and the
session gets Delta's SQL extension and catalog.

Where the jars come from: ``make peers`` fetches ``io.delta:delta-spark_2.13`` at
``DELTA_SPARK_VERSION`` (built against Spark 4.2.0, the pinned pyspark) with Maven into
``~/.cache/lakefold/peers/delta-spark`` (``infra/peers/delta-spark/pom.xml``). Not the
``delta-spark`` pip package's ``configure_spark_with_delta_pip``: that resolves the jars with
Spark's Ivy at every session start, which needs the network then and leaves an Ivy cache in the
home directory; fetched jars on ``spark.jars`` start the same session offline, and the class
archive (``_class_archive``) covers them like any other ``spark.jars``.

Where lakefold uses it when it is on (ARCHITECTURE.md, "delta-spark and delta-rs"): reading a
table that needs a reader feature the file-list reader refuses (``read_delta``, ``lakefold
query``); every write stays with delta-rs (the exactly-once app transactions, measured faster
for lakefold's batches). Local tables only: delta-spark on ``s3://`` needs hadoop-aws.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from lakefold.core.fetched_jars import PEERS_DIR, fetched_jars
from lakefold.spark.exceptions import SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The delta-spark release ``make peers`` fetches: the newest whose build uses Spark 4.2.0.
DELTA_SPARK_VERSION: Final = "4.4.0"
DELTA_EXTENSION: Final = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG: Final = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: Where ``make peers`` puts the jars.
DEFAULT_JARS_DIR: Final = PEERS_DIR / "delta-spark"
# The jars without which the session cannot start Delta's extension.
_REQUIRED: Final = ("delta-spark_2.13-", "delta-storage-")


class DeltaSparkJarsError(SparkTerminalError):
    """delta-spark was asked for, but its jars are not where the setting says."""


def delta_spark_jars(jars_dir: Path | None = None) -> list[Path]:
    """The jars of ``jars_dir`` (default ``DEFAULT_JARS_DIR``), checked to hold delta-spark
    and delta-storage; raises DeltaSparkJarsError naming the fix when they are missing."""
    where = jars_dir if jars_dir is not None else DEFAULT_JARS_DIR
    jars, missing = fetched_jars(where, _REQUIRED)
    if missing:
        raise DeltaSparkJarsError(
            f"delta-spark is on (LAKEFOLD_DELTA_SPARK) but {where} has no {', '.join(missing)} "
            f"jar; run `make peers` (fetches io.delta:delta-spark_2.13:{DELTA_SPARK_VERSION} "
            "with Maven), or set LAKEFOLD_DELTA_SPARK_JARS to a directory holding them")
    return jars


def with_delta_spark(conf: Mapping[str, str], jars_dir: Path | None = None) -> dict[str, str]:
    """``conf`` plus what turns delta-spark on: its jars appended to ``spark.jars``, Delta's
    SQL extension appended to ``spark.sql.extensions``, and Delta's catalog as the session
    catalog (unless ``conf`` names another one)."""
    jars = ",".join(str(jar) for jar in delta_spark_jars(jars_dir))
    merged = dict(conf)

    def append(key: str, value: str) -> None:
        present = [v for v in merged.get(key, "").split(",") if v]
        merged[key] = ",".join([*present, *(v for v in value.split(",") if v not in present)])

    append("spark.jars", jars)
    append("spark.sql.extensions", DELTA_EXTENSION)
    merged.setdefault("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    return merged


def has_delta_spark(spark: SparkSession) -> bool:
    """Whether ``spark`` was started with delta-spark's extension (``with_delta_spark``)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return DELTA_EXTENSION in extensions.split(",")


def delta_spark_dataframe(spark: SparkSession, uri: str, *, version: int | None = None,
                          as_of: dt.datetime | None = None) -> DataFrame:
    """The Delta table at ``uri`` read by delta-spark (at ``version`` or ``as_of`` when
    given); the session must have delta-spark (``has_delta_spark``)."""
    if not has_delta_spark(spark):
        raise SparkTerminalError(
            "this Spark session has no delta-spark; start it with LAKEFOLD_DELTA_SPARK=true")
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    elif as_of is not None:
        reader = reader.option("timestampAsOf", as_of.isoformat())
    return reader.load(uri)
