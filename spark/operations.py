"""What the application (CLI, benches) needs of the Spark layer beyond its user API: resolving
a table name or path against a catalog, splitting a position range the way the sources do, and
delta-spark on a session (``_delta_spark``).
Loaded lazily, like the package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.spark._catalog import resolve_table
    from lakefold.spark._delta_spark import (
        DELTA_SPARK_VERSION,
        DeltaSparkJarsError,
        delta_spark_dataframe,
        has_delta_spark,
        with_delta_spark,
    )
    from lakefold.spark._source_positions import PositionRange, ReadOptions, split_range

_EXPORTS: dict[str, str] = {
    "resolve_table": "lakefold.spark._catalog",
    "DELTA_SPARK_VERSION": "lakefold.spark._delta_spark",
    "DeltaSparkJarsError": "lakefold.spark._delta_spark",
    "delta_spark_dataframe": "lakefold.spark._delta_spark",
    "has_delta_spark": "lakefold.spark._delta_spark",
    "with_delta_spark": "lakefold.spark._delta_spark",
    "PositionRange": "lakefold.spark._source_positions",
    "ReadOptions": "lakefold.spark._source_positions",
    "split_range": "lakefold.spark._source_positions",
}

__all__ = ["DELTA_SPARK_VERSION", "DeltaSparkJarsError", "PositionRange", "ReadOptions",
           "delta_spark_dataframe", "has_delta_spark", "resolve_table", "split_range",
           "with_delta_spark"]

__getattr__ = lazy_getattr("lakefold.spark.operations", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
