"""Spark: the session, data sources over changelog streams and events, the Delta sink, query.

Names are imported lazily (PEP 562): Spark's Python workers import one source module, e.g.
``lakefold.spark._source_events``, and must not pay for deltalake, polars and the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
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
        DeltaCommitConflictError,
        NotADeltaTableError,
        QueryError,
        SchemaMergeError,
        SparkLayerError,
        UnknownTableError,
    )

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "CHANGELOG_SOURCE": "lakefold.spark._sources",
    "CommitPolicy": "lakefold.spark._delta_commit",
    "DeltaCommitConflictError": "lakefold.spark.exceptions",
    "DeltaSnapshot": "lakefold.spark._delta_read",
    "DeltaTarget": "lakefold.spark._delta_target",
    "EVENTS_SOURCE": "lakefold.spark._sources",
    "Engine": "lakefold.spark._query",
    "LakeCatalog": "lakefold.spark._catalog",
    "NotADeltaTableError": "lakefold.spark.exceptions",
    "QueryError": "lakefold.spark.exceptions",
    "SchemaMergeError": "lakefold.spark.exceptions",
    "SparkLayerError": "lakefold.spark.exceptions",
    "StaticCatalog": "lakefold.spark._catalog",
    "TableCatalog": "lakefold.spark._catalog",
    "UnknownTableError": "lakefold.spark.exceptions",
    "WriteMode": "lakefold.spark._delta_target",
    "WriteResult": "lakefold.spark._delta_target",
    "catalog_for": "lakefold.spark._catalog",
    "delta_sink": "lakefold.spark._delta_sink",
    "load_snapshot": "lakefold.spark._delta_read",
    "optimize_table": "lakefold.spark._delta_maintenance",
    "read_delta": "lakefold.spark._delta_read",
    "register_sources": "lakefold.spark._sources",
    "run_query": "lakefold.spark._query",
    "session_from_settings": "lakefold.spark._session",
    "spark_session": "lakefold.spark._session",
    "vacuum_table": "lakefold.spark._delta_maintenance",
    "write_batch": "lakefold.spark._delta_sink",
}

__all__ = [
    "CHANGELOG_SOURCE",
    "EVENTS_SOURCE",
    "CommitPolicy",
    "DeltaCommitConflictError",
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


__getattr__ = lazy_getattr("lakefold.spark", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
