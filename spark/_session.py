"""The Spark session lakefold runs on: ``local[*]`` by default, any cluster by master URL."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Measured on a 2-core machine (../shared/FIELD-NOTES.md): the UI and console progress cost
# start-up time and print noise; the default 200 shuffle partitions make small local jobs slow.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


def spark_session(
    master: str | None = None,
    *,
    conf: Mapping[str, str] | None = None,
    app_name: str = "lakefold",
) -> SparkSession:
    """Get or create the Spark session, with lakefold's defaults under ``conf``.

    Spark's Python workers use this interpreter, so they import the same installed lakefold
    (sources and sinks must be importable there).
    """
    from pyspark.sql import SparkSession

    # PySpark takes the workers' interpreter from PYSPARK_PYTHON only (the spark.pyspark.python
    # conf is ignored by SparkContext), defaulting to `python3` on PATH, which is not this venv
    # and cannot import lakefold's sources and sinks.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master or "local[*]").appName(app_name)
    settings = {**DEFAULT_CONF, "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable, **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
