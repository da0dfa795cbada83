"""The Spark session lakefold runs on: ``local[*]`` by default, any cluster by master URL."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.core.object_store import ObjectStore

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


def default_driver_log() -> Path:
    """Where a driver JVM's own output goes when the caller names no file: a per-user file in
    the temporary directory (the CLI uses ``$LAKEFOLD_HOME/logs/spark-driver.log``)."""
    return Path(tempfile.gettempdir()) / f"lakefold-{os.getuid()}" / "spark-driver.log"


def driver_log() -> Path | None:
    """The file the running driver JVM writes its output to (None: no driver started here)."""
    return _driver_log


_driver_log: Path | None = None
_DRIVER_LOG_MAX_BYTES = 16 * 1024 * 1024


def _open_driver_log(path: Path) -> BinaryIO:
    """``path`` opened for appending; a file over ``_DRIVER_LOG_MAX_BYTES`` is first moved to
    ``<name>.1`` (replacing the one before), so the log stays bounded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.stat().st_size > _DRIVER_LOG_MAX_BYTES:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    return path.open("ab")


def _launch_driver(settings: Mapping[str, str], log_path: Path) -> None:
    """Start the driver JVM (pyspark's gateway) as pyspark would, but with its standard output
    and error appended to ``log_path`` instead of the user's terminal.

    The JVM and the Spark launcher write there what is not an answer to the user: the JVM's
    "Using incubator modules" warning, log4j's start-up lines, and the stack traces an orphaned
    driver prints when its Python parent was killed (it notices its standard input closing
    and exits). Spark's errors still reach Python as exceptions, which lakefold reports."""
    global _driver_log
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        conf = SparkConf(loadDefaults=False)
        for key, value in settings.items():
            conf.set(key, value)
        with _open_driver_log(log_path) as log:
            gateway = launch_gateway(  # type: ignore[no-untyped-call]
                conf, popen_kwargs={"stdout": log, "stderr": log})
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
        _driver_log = log_path


def spark_session(
    master: str | None = None,
    *,
    conf: Mapping[str, str] | None = None,
    app_name: str = "lakefold",
    log_path: Path | None = None,
    object_store: ObjectStore | None = None,
    hadoop_aws_jars: Path | None = None,
) -> SparkSession:
    """Get or create the Spark session, with lakefold's defaults under ``conf``.

    Spark's Python workers use this interpreter, so they import the same installed lakefold
    (sources and sinks must be importable there). A new driver JVM writes its own output
    (start-up notices, log lines, stack traces) to ``log_path`` (default:
    ``default_driver_log()``), never to this process's terminal; ``driver_log()`` says where.

    With ``object_store`` (the lake's bucket), Spark reaches it through Hadoop's S3A for its
    checkpoints: hadoop-aws's jars from ``hadoop_aws_jars`` (HadoopAwsJarsError, one line
    naming `make peers`, when they are missing), the store's endpoint as conf, its credentials
    on the driver's Hadoop configuration (``lakefold.spark._s3a``).
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
    if object_store is not None:
        from lakefold.spark._s3a import with_s3a

        settings = with_s3a(settings, object_store, hadoop_aws_jars)
    if SparkContext._active_spark_context is None:  # a new driver JVM: its options count
        settings["spark.driver.extraJavaOptions"] = driver_java_options(master, settings)
    if SparkContext._gateway is None:
        _launch_driver({"spark.master": master or "local[*]", "spark.app.name": app_name,
                        **settings}, log_path or default_driver_log())
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if object_store is not None:
        from lakefold.spark._s3a import use_s3a_credentials

        use_s3a_credentials(session, object_store)
    return session

