"""Spark: the session, data sources over changelog streams and events, the Delta sink, query."""

from lakefold.spark._session import spark_session
from lakefold.spark.exceptions import DeltaCommitConflict, SparkLayerError

__all__ = ["DeltaCommitConflict", "SparkLayerError", "spark_session"]
