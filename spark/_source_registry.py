"""Registering lakefold's Spark data sources on a session.

``register_sources(spark)`` makes ``spark.readStream.format("lakefold_events")`` and
``format("lakefold_changelog")`` (and their batch ``spark.read`` forms) available. The sources
live in the installed ``lakefold.spark`` package, so Spark's Python workers import them by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EVENTS_SOURCE = "lakefold_events"
CHANGELOG_SOURCE = "lakefold_changelog"


def register_sources(spark: SparkSession) -> None:
    """Register the event store and changelog sources on ``spark`` (idempotent)."""
    from lakefold.spark._source_changelog import ChangelogDataSource
    from lakefold.spark._source_events import EventsDataSource

    spark.dataSource.register(EventsDataSource)
    spark.dataSource.register(ChangelogDataSource)
