"""Projections: user-defined views kept up to date in Delta, Redis and search, and rebuilt.

Define projections in a Python module (see ``lakefold.projections._api`` for a full example)::

    from lakefold.projections import Fold, changelog, events, projection, delta_table, \\
        redis_cache, search_index

and run them with ``lakefold run --projections FILE`` (or ``Runner`` in-process). Readers:
``RedisCacheReader.get(view, key)``, ``SearchIndexReader.search(view, query)`` and
``lakefold query`` (through ``table_catalog``), all resolving the current generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakefold.projections._api import (
    STREAM_KEY,
    Fold,
    Projection,
    Registry,
    current_registry,
    load_projections,
    projection,
    registering_into,
)
from lakefold.projections._catalog import Catalog, Generation, SinkRoots
from lakefold.projections._deadletters import DeadLetter, DeadLetters
from lakefold.projections._model import (
    ChangelogSource,
    DeltaTableTarget,
    EventSource,
    ProjectionOptions,
    Record,
    RedisCacheTarget,
    SearchIndexTarget,
    changelog,
    delta_table,
    events,
    redis_cache,
    search_index,
)
from lakefold.projections._redis import RedisCacheReader
from lakefold.projections._search import SearchHit, SearchIndexReader
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    ProjectionError,
    ProjectionNotFound,
    ProjectionStateError,
    RecordFailed,
    UnknownSourceError,
)

if TYPE_CHECKING:
    from lakefold.settings import Settings

__all__ = [
    "STREAM_KEY",
    "Catalog",
    "ChangelogSource",
    "DeadLetter",
    "DeadLetters",
    "DeltaTableTarget",
    "EventSource",
    "Fold",
    "Generation",
    "IncompatibleTargetError",
    "MissingKeyError",
    "Projection",
    "ProjectionDefinitionError",
    "ProjectionError",
    "ProjectionNotFound",
    "ProjectionOptions",
    "ProjectionStateError",
    "Record",
    "RecordFailed",
    "RedisCacheReader",
    "RedisCacheTarget",
    "Registry",
    "Runner",
    "RunnerConfig",
    "SearchHit",
    "SearchIndexReader",
    "SearchIndexTarget",
    "SinkRoots",
    "UnknownSourceError",
    "changelog",
    "current_registry",
    "delta_table",
    "events",
    "load_projections",
    "projection",
    "redis_cache",
    "registering_into",
    "search_index",
    "table_catalog",
]


def __getattr__(name: str) -> Any:
    # The runner imports pyspark; keep `import lakefold.projections` light for readers.
    if name in ("Runner", "RunnerConfig"):
        from lakefold.projections import _runner

        return getattr(_runner, name)
    raise AttributeError(f"module 'lakefold.projections' has no attribute {name!r}")


def table_catalog(settings: Settings) -> Any:
    """The generation-aware ``TableCatalog`` for ``lakefold query``: each Delta-target
    projection under its name, at its current generation's path (see ``_tables``)."""
    from lakefold.projections._tables import ProjectionTableCatalog

    return ProjectionTableCatalog.from_settings(settings)
