"""Spark: the session, the source layer, the Delta sink, query.

The source layer is the one way anything reads the stores into Spark (the ``_source_*``
modules): ``_source_inputs`` (what is read: ``ChangelogSource``, ``EventSource``, and
``DeltaSource``, a Delta table's versions as change rows, read by ``_source_delta``),
``_source_columns`` (the record metadata columns every frame starts with, documented there),
``_source_reads`` (heads and typed range reads of both stores), ``_source_positions`` (offsets,
read limits, partition splitting), ``_source_truncates`` (how truncate records are handed
over), the public formats ``lakefold_events`` / ``lakefold_changelog`` (``_source_events``,
``_source_changelog`` on ``_source_formats``, registered by ``_source_registry``) and the
projections' formats (``_source_records``, partitioned; ``_source_live``, read on the driver).

Names are imported lazily (PEP 562): Spark's Python workers import one source module, e.g.
``lakefold.spark._source_events``, and must not pay for deltalake, polars and the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.spark._catalog import LakeCatalog, StaticCatalog, TableCatalog
    from lakefold.spark._delta_commit import CommitPolicy
    from lakefold.spark._delta_maintenance import optimize_table, vacuum_table
    from lakefold.spark._delta_read import DeltaSnapshot, load_snapshot, read_delta
    from lakefold.spark._delta_sink import delta_sink, write_batch
    from lakefold.spark._delta_target import DeltaTarget, WriteMode, WriteResult
    from lakefold.spark._query import Engine, run_query
    from lakefold.spark._session import spark_session
    from lakefold.spark._source_registry import CHANGELOG_SOURCE, EVENTS_SOURCE, register_sources
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
    "CHANGELOG_SOURCE": "lakefold.spark._source_registry",
    "CommitPolicy": "lakefold.spark._delta_commit",
    "DeltaCommitConflictError": "lakefold.spark.exceptions",
    "DeltaSnapshot": "lakefold.spark._delta_read",
    "DeltaTarget": "lakefold.spark._delta_target",
    "EVENTS_SOURCE": "lakefold.spark._source_registry",
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
    "delta_sink": "lakefold.spark._delta_sink",
    "load_snapshot": "lakefold.spark._delta_read",
    "optimize_table": "lakefold.spark._delta_maintenance",
    "read_delta": "lakefold.spark._delta_read",
    "register_sources": "lakefold.spark._source_registry",
    "run_query": "lakefold.spark._query",
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
    "delta_sink",
    "load_snapshot",
    "optimize_table",
    "read_delta",
    "register_sources",
    "run_query",
    "spark_session",
    "vacuum_table",
    "write_batch",
]


__getattr__ = lazy_getattr("lakefold.spark", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
