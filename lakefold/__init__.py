"""lakefold: change-data capture and event sourcing on PostgreSQL, projected by Spark.

The names below are imported lazily (PEP 562): ``import lakefold`` stays cheap, and Spark's Python
workers that import one source module do not pull in the whole platform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.capture import Capture, CaptureConfig, ChangelogStore
    from lakefold.core.exceptions import (
        ConfigurationError,
        LakefoldError,
        TerminalError,
        TransientError,
    )
    from lakefold.eventstore import EventStore, StoreOptions
    from lakefold.local import LocalPostgres, LocalRedis
    from lakefold.projections import (
        Fold,
        Runner,
        RunnerConfig,
        changelog,
        delta_changes,
        delta_table,
        events,
        projection,
        redis_cache,
        search_index,
        view,
    )
    from lakefold.schemas import EventRegistry, EventType, NewEvent
    from lakefold.settings import Settings, load_settings
    from lakefold.spark import spark_session

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Capture": "lakefold.capture",
    "CaptureConfig": "lakefold.capture",
    "ChangelogStore": "lakefold.capture",
    "EventStore": "lakefold.eventstore",
    "StoreOptions": "lakefold.eventstore",
    "EventRegistry": "lakefold.schemas",
    "EventType": "lakefold.schemas",
    "NewEvent": "lakefold.schemas",
    "Runner": "lakefold.projections",
    "RunnerConfig": "lakefold.projections",
    "projection": "lakefold.projections",
    "Fold": "lakefold.projections",
    "changelog": "lakefold.projections",
    "events": "lakefold.projections",
    "delta_changes": "lakefold.projections",
    "delta_table": "lakefold.projections",
    "redis_cache": "lakefold.projections",
    "search_index": "lakefold.projections",
    "view": "lakefold.projections",
    "ConfigurationError": "lakefold.core.exceptions",
    "LakefoldError": "lakefold.core.exceptions",
    "TerminalError": "lakefold.core.exceptions",
    "TransientError": "lakefold.core.exceptions",
    "LocalPostgres": "lakefold.local",
    "LocalRedis": "lakefold.local",
    "Settings": "lakefold.settings",
    "load_settings": "lakefold.settings",
    "spark_session": "lakefold.spark",
}

__all__ = [
    "Capture",
    "CaptureConfig",
    "ChangelogStore",
    "ConfigurationError",
    "EventRegistry",
    "EventStore",
    "EventType",
    "Fold",
    "LakefoldError",
    "LocalPostgres",
    "LocalRedis",
    "NewEvent",
    "Runner",
    "RunnerConfig",
    "Settings",
    "StoreOptions",
    "TerminalError",
    "TransientError",
    "changelog",
    "delta_changes",
    "delta_table",
    "events",
    "load_settings",
    "projection",
    "redis_cache",
    "search_index",
    "spark_session",
    "view",
]


__getattr__ = lazy_getattr("lakefold", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
