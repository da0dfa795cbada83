"""Spark: the session, data sources over changelog streams and events, the Delta sink, query."""

from lakefold.spark._delta_commit import CommitPolicy
from lakefold.spark._delta_read import DeltaSnapshot, load_snapshot, read_delta
from lakefold.spark._delta_sink import delta_sink, write_batch
from lakefold.spark._delta_target import DeltaTarget, WriteMode, WriteResult
from lakefold.spark._session import spark_session
from lakefold.spark.exceptions import (
    DeltaCommitConflict,
    NotADeltaTableError,
    QueryError,
    SchemaMergeError,
    SparkLayerError,
    UnknownTableError,
)

__all__ = [
    "CommitPolicy",
    "DeltaCommitConflict",
    "DeltaSnapshot",
    "DeltaTarget",
    "NotADeltaTableError",
    "QueryError",
    "SchemaMergeError",
    "SparkLayerError",
    "UnknownTableError",
    "WriteMode",
    "WriteResult",
    "delta_sink",
    "load_snapshot",
    "read_delta",
    "spark_session",
    "write_batch",
]
