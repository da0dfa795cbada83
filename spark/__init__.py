"""Spark: the session, data sources over changelog streams and events, the Delta sink, query."""

from lakefold.spark._catalog import LakeCatalog, StaticCatalog, TableCatalog, catalog_for
from lakefold.spark._delta_commit import CommitPolicy
from lakefold.spark._delta_maintenance import optimize_table, vacuum_table
from lakefold.spark._delta_read import DeltaSnapshot, load_snapshot, read_delta
from lakefold.spark._delta_sink import delta_sink, write_batch
from lakefold.spark._delta_target import DeltaTarget, WriteMode, WriteResult
from lakefold.spark._query import Engine, run_query
from lakefold.spark._session import session_from_settings, spark_session
from lakefold.spark._sources import CHANGELOG_SOURCE, EVENTS_SOURCE, register_sources
from lakefold.spark.exceptions import (
    DeltaCommitConflict,
    NotADeltaTableError,
    QueryError,
    SchemaMergeError,
    SparkLayerError,
    UnknownTableError,
)

__all__ = [
    "CHANGELOG_SOURCE",
    "EVENTS_SOURCE",
    "CommitPolicy",
    "DeltaCommitConflict",
    "DeltaSnapshot",
    "DeltaTarget",
    "Engine",
    "LakeCatalog",
    "NotADeltaTableError",
    "QueryError",
    "SchemaMergeError",
    "SparkLayerError",
    "StaticCatalog",
    "TableCatalog",
    "UnknownTableError",
    "WriteMode",
    "WriteResult",
    "catalog_for",
    "delta_sink",
    "load_snapshot",
    "optimize_table",
    "read_delta",
    "register_sources",
    "run_query",
    "session_from_settings",
    "spark_session",
    "vacuum_table",
    "write_batch",
]
