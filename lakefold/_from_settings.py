"""What the application builds from its settings for the layers below it.

The lower layers take plain arguments (a master URL, a log path, a DSN, a directory) and never
read ``lakefold.settings`` themselves; the commands, the demo and the benchmarks read the
settings once and hand these down.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lakefold.core.exceptions import ConfigurationError, LakefoldError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.projections import Registry
    from lakefold.settings import Settings
    from lakefold.spark import TableCatalog


class ProjectionsModuleError(ConfigurationError):
    """The projections module cannot be imported: its file, line and Python's reason."""


def load_projections_module(location: str) -> Registry:
    """The projections and views of ``location`` (a ``.py`` file or a module name); a module
    that Python cannot import (a syntax error, a name that is not defined) is one
    ProjectionsModuleError naming the file and the line, not a traceback."""
    import traceback

    from lakefold.projections import load_projections

    try:
        return load_projections(location)
    except LakefoldError:
        raise
    except SyntaxError as e:
        where = f"{e.filename or location}, line {e.lineno}" if e.lineno else location
        raise ProjectionsModuleError(
            f"cannot load the projections in {where}: {e.msg}; fix the file") from None
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if f.filename and Path(f.filename).resolve() == Path(location).resolve()]
        where = f"{location}, line {frames[-1].lineno}" if frames else location
        raise ProjectionsModuleError(
            f"cannot load the projections in {where}: {type(e).__name__}: {e}; fix the "
            "file") from None


def settings_driver_log(settings: Settings) -> Path:
    """The driver log of a session made for ``settings``: ``$LAKEFOLD_HOME/logs``."""
    return settings.home / "logs" / "spark-driver.log"


def session_from_settings(settings: Settings, *, app_name: str = "lakefold",
                          conf: Mapping[str, str] | None = None) -> SparkSession:
    """The session for ``settings``: ``spark_master`` (``local[*]`` by default), ``conf`` and
    then ``spark_conf`` on top of lakefold's defaults, and delta-spark's jars, extension and
    catalog with ``delta_spark`` on (DeltaSparkJarsError, one line naming `make peers`, when
    its jars are missing); with the lake on a bucket, hadoop-aws for the Spark checkpoints
    there (HadoopAwsJarsError naming `make peers` when missing); the driver's own output goes
    to ``settings_driver_log(settings)``."""
    from lakefold.spark import spark_session
    from lakefold.spark.operations import with_delta_spark

    merged = {**(conf or {}), **settings.spark_conf}
    if settings.delta_spark:
        merged = with_delta_spark(merged, settings.delta_spark_jars)
    return spark_session(settings.spark_master, conf=merged, app_name=app_name,
                         log_path=settings_driver_log(settings),
                         object_store=settings.object_store(),
                         hadoop_aws_jars=settings.hadoop_aws_jars)


def checked_lake(settings: Settings) -> str | Path:
    """Where the lake is (``Settings.lake_location``); with an object store set, its bucket is
    reached once first, so bad credentials, a missing bucket or an endpoint that does not
    answer are one ObjectStoreError line naming the setting before any work starts."""
    from lakefold.core.object_store import check_object_store

    store = settings.object_store()
    if store is not None:
        check_object_store(store)
    return settings.lake_location


def table_catalog(settings: Settings) -> TableCatalog:
    """The tables ``lakefold query``, ``optimize`` and ``vacuum`` name: each Delta-target
    projection at its current generation (from the store), over the Delta tables of the lake
    directory."""
    from lakefold.projections import table_catalog as projection_table_catalog

    return projection_table_catalog(settings.resolved_store_dsn(), checked_lake(settings))
