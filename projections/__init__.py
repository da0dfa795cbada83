"""Projections: user-defined views kept up to date in Delta, Redis and search, and rebuilt.

Define projections in a Python module (see ``lakefold.projections._api`` for a full example)::

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

    from lakefold.projections._api import (
        STREAM_KEY,
        Fold,
        Projection,
        Registry,
        load_projections,
        projection,
        view,
    )
    from lakefold.projections._deadletters import DeadLetter, DeadLetters
    from lakefold.projections._interval_joins import IntervalJoin, interval_join
    from lakefold.projections._lookups import Lookup, lookup
    from lakefold.projections._model import ProjectionOptions, Record, changelog, events
    from lakefold.projections._redis import RedisCacheReader
    from lakefold.projections._run_report import ProjectionReport
    from lakefold.projections._runner import Runner, RunnerConfig
    from lakefold.projections._search import SearchHit, SearchIndexReader
    from lakefold.projections._search_matches import MatchedText
    from lakefold.projections._tables import ProjectionTableCatalog
    from lakefold.projections._target_specs import (
        DeltaTableTarget,
        RedisCacheTarget,
        SearchIndexTarget,
        delta_table,
        redis_cache,
        search_index,
    )
    from lakefold.projections._view_api import View
    from lakefold.projections._windows import Window, hopping, session, tumbling
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
    from lakefold.spark._source_inputs import ChangelogSource, EventSource

# Lazy exports: Spark's Python workers may import a projections module (the retry source),
# which runs this file; importing Redis, Tantivy and psycopg here would add a second to every
# worker start.
_EXPORTS: dict[str, str] = {
    "STREAM_KEY": "_api", "Fold": "_api", "Projection": "_api", "Registry": "_api",
    "load_projections": "_api", "projection": "_api", "view": "_api", "View": "_view_api",
    "DeadLetter": "_deadletters", "DeadLetters": "_deadletters",
    "ChangelogSource": "_model", "DeltaTableTarget": "_target_specs", "EventSource": "_model",
    "ProjectionOptions": "_model", "Record": "_model", "RedisCacheTarget": "_target_specs",
    "SearchIndexTarget": "_target_specs", "changelog": "_model", "delta_table": "_target_specs",
    "events": "_model", "redis_cache": "_target_specs", "search_index": "_target_specs",
    "RedisCacheReader": "_redis",
    "SearchHit": "_search", "SearchIndexReader": "_search", "MatchedText": "_search_matches",
    "Runner": "_runner", "RunnerConfig": "_runner", "ProjectionReport": "_run_report",
    "BehindCompactionError": "exceptions",
    "IncompatibleTargetError": "exceptions", "MissingKeyError": "exceptions",
    "NotMaintainableError": "exceptions",
    "ProjectionDefinitionError": "exceptions", "ProjectionError": "exceptions",
    "ProjectionNotFoundError": "exceptions", "ProjectionStateError": "exceptions",
    "RecordFailedError": "exceptions", "StatefulChangelogError": "exceptions",
    "UnknownSourceError": "exceptions",
    "Window": "_windows", "hopping": "_windows", "tumbling": "_windows",
    "session": "_windows",
    "Lookup": "_lookups", "lookup": "_lookups",
    "IntervalJoin": "_interval_joins", "interval_join": "_interval_joins",
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
    from lakefold.projections._tables import ProjectionTableCatalog

    return ProjectionTableCatalog(store_dsn=store_dsn, lake_path=lake_path)
