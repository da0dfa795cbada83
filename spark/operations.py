"""What the application (CLI, benches) needs of the Spark layer beyond its user API: resolving
a table name or path against a catalog, and splitting a position range the way the sources do.
Loaded lazily, like the package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.spark._catalog import resolve_table
    from lakefold.spark._source_positions import PositionRange, ReadOptions, split_range

_EXPORTS: dict[str, str] = {
    "resolve_table": "lakefold.spark._catalog",
    "PositionRange": "lakefold.spark._source_positions",
    "ReadOptions": "lakefold.spark._source_positions",
    "split_range": "lakefold.spark._source_positions",
}

__all__ = ["PositionRange", "ReadOptions", "resolve_table", "split_range"]

__getattr__ = lazy_getattr("lakefold.spark.operations", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
