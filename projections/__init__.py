"""Projections: user-defined views kept up to date in Delta, Redis and search, and rebuilt.

Define projections in a Python module (see ``lakefold.projections.definitions._api`` for a
full example)::

    from lakefold.projections import Fold, changelog, events, delta_changes, projection, \\
        delta_table, redis_cache, search_index

and run them with ``lakefold run --projections FILE`` (or ``Runner`` in-process). Readers:
``RedisCacheReader.get(view, key)``, ``SearchIndexReader.search(view, query)`` and
``lakefold query`` (through ``table_catalog``), all resolving the current generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import by_module, lazy_getattr

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from pathlib import Path

    from lakefold.projections.definitions._api import (
        STREAM_KEY,
        Fold,
        Projection,
        Registry,
        load_projections,
        projection,
        view,
    )
    from lakefold.projections.definitions._model import (
        ProjectionOptions,
        Record,
        changelog,
        delta_changes,
        events,
    )
    from lakefold.projections.definitions._target_specs import (
        DeltaTableTarget,
        RedisCacheTarget,
        SearchIndexTarget,
        delta_table,
        redis_cache,
        search_index,
    )
    from lakefold.projections.definitions._view_api import View
    from lakefold.projections.definitions._view_inputs import (
        IntervalJoin,
        Lookup,
        interval_join,
        lookup,
    )
    from lakefold.projections.definitions._windows import Window, hopping, session, tumbling
    from lakefold.projections.exceptions import (
        BehindCompactionError,
        IncompatibleTargetError,
        MissingKeyError,
        NotMaintainableError,
        ProjectionDefinitionError,
        ProjectionError,
        ProjectionNotFoundError,
        ProjectionStateError,
        RecordFailedError,
        StatefulChangelogError,
        UnknownSourceError,
    )
    from lakefold.projections.runtime._run_report import ProjectionReport
    from lakefold.projections.runtime._runner import Runner, RunnerConfig
    from lakefold.projections.state._deadletters import DeadLetter, DeadLetters
    from lakefold.projections.targets._redis import RedisCacheReader
    from lakefold.projections.targets._search import SearchHit, SearchIndexReader
    from lakefold.projections.targets._search_matches import MatchedText
    from lakefold.projections.targets._tables import ProjectionTableCatalog
    from lakefold.spark.internals import ChangelogSource, DeltaSource, EventSource

# Lazy exports: Spark's Python workers may import a projections module (the retry source),
# which runs this file; importing Redis, Tantivy and psycopg here would add a second to every
# worker start.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "lakefold.projections.definitions._api": (
        "STREAM_KEY", "Fold", "Projection", "Registry", "load_projections", "projection",
        "view",
    ),
    "lakefold.projections.definitions._model": (
        "ChangelogSource", "DeltaSource", "EventSource", "ProjectionOptions", "Record",
        "changelog", "delta_changes", "events",
    ),
    "lakefold.projections.definitions._target_specs": (
        "DeltaTableTarget", "RedisCacheTarget", "SearchIndexTarget", "delta_table",
        "redis_cache", "search_index",
    ),
    "lakefold.projections.definitions._view_api": ("View",),
    "lakefold.projections.definitions._view_inputs": (
        "Lookup", "lookup", "IntervalJoin", "interval_join",
    ),
    "lakefold.projections.definitions._windows": ("Window", "hopping", "tumbling", "session"),
    "lakefold.projections.runtime._run_report": ("ProjectionReport",),
    "lakefold.projections.runtime._runner": ("Runner", "RunnerConfig"),
    "lakefold.projections.state._deadletters": ("DeadLetter", "DeadLetters"),
    "lakefold.projections.targets._redis": ("RedisCacheReader",),
    "lakefold.projections.targets._search": ("SearchHit", "SearchIndexReader"),
    "lakefold.projections.targets._search_matches": ("MatchedText",),
    "lakefold.projections.exceptions": (
        "BehindCompactionError", "IncompatibleTargetError", "MissingKeyError",
        "NotMaintainableError", "ProjectionDefinitionError", "ProjectionError",
        "ProjectionNotFoundError", "ProjectionStateError", "RecordFailedError",
        "StatefulChangelogError", "UnknownSourceError",
    ),
}

__all__ = [
    "STREAM_KEY",
    "BehindCompactionError",
    "ChangelogSource",
    "DeadLetter",
    "DeadLetters",
    "DeltaSource",
    "DeltaTableTarget",
    "EventSource",
    "Fold",
    "IncompatibleTargetError",
    "IntervalJoin",
    "Lookup",
    "MatchedText",
    "MissingKeyError",
    "NotMaintainableError",
    "Projection",
    "ProjectionDefinitionError",
    "ProjectionError",
    "ProjectionNotFoundError",
    "ProjectionOptions",
    "ProjectionReport",
    "ProjectionStateError",
    "Record",
    "RecordFailedError",
    "RedisCacheReader",
    "RedisCacheTarget",
    "Registry",
    "Runner",
    "RunnerConfig",
    "SearchHit",
    "SearchIndexReader",
    "SearchIndexTarget",
    "StatefulChangelogError",
    "UnknownSourceError",
    "View",
    "Window",
    "changelog",
    "delta_changes",
    "delta_table",
    "events",
    "hopping",
    "interval_join",
    "load_projections",
    "lookup",
    "projection",
    "redis_cache",
    "search_index",
    "session",
    "table_catalog",
    "tumbling",
    "view",
]


__getattr__ = lazy_getattr("lakefold.projections", by_module(_EXPORTS))


def table_catalog(store_dsn: str | None, lake_path: Path | str) -> ProjectionTableCatalog:
    """The generation-aware ``TableCatalog`` for ``lakefold query``: each Delta-target
    projection under its name, at its current generation's path (read from the store at
    ``store_dsn``), over the Delta tables directly under ``lake_path`` (see ``_tables``)."""
    from lakefold.projections.targets._tables import ProjectionTableCatalog

    return ProjectionTableCatalog(store_dsn=store_dsn, lake_path=lake_path)
