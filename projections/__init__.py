"""Projections: user-defined views kept up to date in Delta, Redis and search, and rebuilt.

Define projections in a Python module (see ``lakefold.projections.spec._api`` for a full example)::

    from lakefold.projections import Fold, changelog, events, projection, delta_table, \\
        redis_cache, search_index

and run them with ``lakefold run --projections FILE`` (or ``Runner`` in-process). Readers:
``RedisCacheReader.get(view, key)``, ``SearchIndexReader.search(view, query)`` and
``lakefold query`` (through ``table_catalog``), all resolving the current generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:  # the real names for type checkers; at run time they load lazily
    from pathlib import Path

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
    from lakefold.projections.spec._api import (
        STREAM_KEY,
        Fold,
        Projection,
        Registry,
        load_projections,
        projection,
        view,
    )
    from lakefold.projections.spec._model import ProjectionOptions, Record, changelog, events
    from lakefold.projections.spec._target_specs import (
        DeltaTableTarget,
        RedisCacheTarget,
        SearchIndexTarget,
        delta_table,
        redis_cache,
        search_index,
    )
    from lakefold.projections.spec._view_api import View
    from lakefold.projections.spec._view_inputs import IntervalJoin, Lookup, interval_join, lookup
    from lakefold.projections.spec._windows import Window, hopping, session, tumbling
    from lakefold.projections.state._deadletters import DeadLetter, DeadLetters
    from lakefold.projections.targets._redis import RedisCacheReader
    from lakefold.projections.targets._search import SearchHit, SearchIndexReader
    from lakefold.projections.targets._search_matches import MatchedText
    from lakefold.projections.targets._tables import ProjectionTableCatalog
    from lakefold.spark.internals import ChangelogSource, EventSource

# Lazy exports: Spark's Python workers may import a projections module (the retry source),
# which runs this file; importing Redis, Tantivy and psycopg here would add a second to every
# worker start.
_EXPORTS: dict[str, str] = {
    "Lookup": "spec._view_inputs", "lookup": "spec._view_inputs",
    "IntervalJoin": "spec._view_inputs", "interval_join": "spec._view_inputs",
    "ProjectionReport": "runtime._run_report",
    "Runner": "runtime._runner", "RunnerConfig": "runtime._runner",
    "STREAM_KEY": "spec._api", "Fold": "spec._api", "Projection": "spec._api", "Registry":
    "spec._api", "load_projections": "spec._api", "projection": "spec._api", "view":
    "spec._api",
    "ChangelogSource": "spec._model", "EventSource": "spec._model", "ProjectionOptions":
    "spec._model", "Record": "spec._model", "changelog": "spec._model", "events": "spec._model",
    "DeltaTableTarget": "spec._target_specs", "RedisCacheTarget": "spec._target_specs",
    "SearchIndexTarget": "spec._target_specs", "delta_table": "spec._target_specs",
    "redis_cache": "spec._target_specs", "search_index": "spec._target_specs",
    "View": "spec._view_api",
    "Window": "spec._windows", "hopping": "spec._windows", "tumbling": "spec._windows",
    "session": "spec._windows",
    "DeadLetter": "state._deadletters", "DeadLetters": "state._deadletters",
    "RedisCacheReader": "targets._redis",
    "SearchHit": "targets._search", "SearchIndexReader": "targets._search",
    "MatchedText": "targets._search_matches",
    "BehindCompactionError": "exceptions", "IncompatibleTargetError": "exceptions",
    "MissingKeyError": "exceptions", "NotMaintainableError": "exceptions",
    "ProjectionDefinitionError": "exceptions", "ProjectionError": "exceptions",
    "ProjectionNotFoundError": "exceptions", "ProjectionStateError": "exceptions",
    "RecordFailedError": "exceptions", "StatefulChangelogError": "exceptions",
    "UnknownSourceError": "exceptions",
}

__all__ = [
    "STREAM_KEY",
    "BehindCompactionError",
    "ChangelogSource",
    "DeadLetter",
    "DeadLetters",
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


__getattr__ = lazy_getattr(
    "lakefold.projections",
    {name: f"lakefold.projections.{module}" for name, module in _EXPORTS.items()},
)


def table_catalog(store_dsn: str | None, lake_path: Path | str) -> ProjectionTableCatalog:
    """The generation-aware ``TableCatalog`` for ``lakefold query``: each Delta-target
    projection under its name, at its current generation's path (read from the store at
    ``store_dsn``), over the Delta tables directly under ``lake_path`` (see ``_tables``)."""
    from lakefold.projections.targets._tables import ProjectionTableCatalog

    return ProjectionTableCatalog(store_dsn=store_dsn, lake_path=lake_path)
