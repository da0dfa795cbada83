"""The Spark session lakefold runs on: ``local[*]`` by default, any cluster by master URL."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.settings import Settings

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
    # Arrow batches between Python workers and the JVM (the lakefold sources yield Arrow):
    # 100k rows per batch doubled a Python source's ingest rate against the 10k default.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # A Python worker has 15 s by default to connect back to the JVM; on a loaded 2-core
    # machine starting one takes longer, which failed micro-batches for nothing.
    "spark.python.authenticate.socketTimeout": "120s",
    # Errors reach Python with Spark's message only; lakefold reports them in one line.
    "spark.sql.pyspark.jvmStacktrace.enabled": "false",
}


# A local driver runs every task too: the throughput collector suits that better than G1's
# concurrent work on a small machine (2 cores: a first streaming replay 7.5 -> 7.2 s, the first
# 10M-event read ~8% faster; measured 2026-11-24). Only when the user's options choose no
# collector: the JVM refuses to start with two.
_LOCAL_COLLECTOR = "-XX:+UseParallelGC"
_COLLECTOR_CHOICE = re.compile(r"-XX:\+Use\w*GC\b")


# Spark's JVM logs WARN lines to stderr while starting (native Hadoop, hostname); a command
# line tool should print only its result and its errors. Errors still reach Python as
# exceptions; this only sets the JVM's log threshold to ERROR from the first line on.
_LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _log4j2_config() -> str:
    """A log4j2 properties file with an ERROR threshold (written once per user)."""
    path = Path(tempfile.gettempdir()) / f"lakefold-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J2_PROPERTIES:
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(_LOG4J2_PROPERTIES)
        scratch.replace(path)
    return str(path)


def driver_java_options(master: str | None, settings: Mapping[str, str]) -> str:
    """The driver JVM's options: lakefold's (log threshold, collector, class archive), then
    the user's ``spark.driver.extraJavaOptions``."""
    from lakefold.spark._class_archive import driver_options

    user = settings.get("spark.driver.extraJavaOptions", "")
    local = (master or "local").startswith("local")
    options = [f"-Dlog4j2.configurationFile={_log4j2_config()}",
               _LOCAL_COLLECTOR if local and not _COLLECTOR_CHOICE.search(user) else "",
               driver_options(settings), user]
    return " ".join(o for o in options if o)


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
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # PySpark takes the workers' interpreter from PYSPARK_PYTHON only (the spark.pyspark.python
    # conf is ignored by SparkContext), defaulting to `python3` on PATH, which is not this venv
    # and cannot import lakefold's sources and sinks.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Bind Spark's driver and block manager to loopback, never to a public interface.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master or "local[*]").appName(app_name)
    settings = {**DEFAULT_CONF, "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable, **(conf or {})}
    if SparkContext._active_spark_context is None:  # a new driver JVM: its options count
        settings["spark.driver.extraJavaOptions"] = driver_java_options(master, settings)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def session_from_settings(settings: Settings, *, app_name: str = "lakefold") -> SparkSession:
    """The session for ``settings``: ``spark_master`` (``local[*]`` by default) and
    ``spark_conf`` on top of lakefold's defaults."""
    return spark_session(settings.spark_master, conf=settings.spark_conf, app_name=app_name)
