"""Checks of a projection's inputs against the stores, before anything runs.

``check_sources_exist`` refuses a changelog source whose table is not captured, a Delta input
that is not a readable Delta table with its key columns, and an event type neither in the
store nor registered; an event category without events is only a warning
(a new system has none yet). The stores are asked through the source layer
(``lakefold.spark._source_reads``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence

from lakefold.projections.exceptions import (
    CatalogUnavailableError,
    MissingKeyError,
    UnknownSourceError,
)
from lakefold.spark.exceptions import (
    DeltaInputColumnError,
    DeltaInputError,
    NotADeltaTableError,
    SourceUnavailableError,
)
from lakefold.spark.internals import ChangelogSource, DeltaSource, Source, source_reads

log = logging.getLogger(__name__)


def event_categories(dsn: str) -> list[str]:
    """Categories that have at least one stream in the event store."""
    try:
        return source_reads.event_categories(dsn)
    except SourceUnavailableError as e:
        raise CatalogUnavailableError(str(e)) from e


def event_types(dsn: str, category: str | None) -> list[str]:
    """Event types present in the store (in one category, or anywhere)."""
    try:
        return source_reads.event_types(dsn, category)
    except SourceUnavailableError as e:
        raise CatalogUnavailableError(str(e)) from e


def _warn_empty_category(projection: str, category: str, categories: Sequence[str]) -> None:
    close = difflib.get_close_matches(category, list(categories), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    log.warning("projection %s: event category %r has no events yet; the projection reads them "
                "as they are appended (known categories: %s%s)", projection, category,
                ", ".join(categories) or "none", hint)


def check_sources_exist(dsn: str, sources: Sequence[Source], *, projection: str,
                        registered_types: Sequence[str] = ()) -> None:
    """Raise UnknownSourceError naming the first source that the stores do not know, with the
    names they do know. An event category without events is not an error (a new system has
    none yet): it is logged as a warning, with the closest known category, and the source
    reads the category's events once they are appended."""
    streams: list[str] | None = None
    categories: list[str] | None = None
    for source in sources:
        if isinstance(source, DeltaSource):
            check_delta_input(source, projection=projection)
            continue
        if isinstance(source, ChangelogSource):
            if streams is None:
                streams = source_reads.changelog_streams(dsn)
            if source.table not in streams:
                raise UnknownSourceError(
                    f"projection {projection}: no changelog stream for table {source.table}; "
                    f"captured tables: {', '.join(streams) or 'none'} (start capture for it "
                    "with `lakefold capture run`)"
                )
            continue
        if source.category is not None:
            if categories is None:
                categories = event_categories(dsn)
            if source.category not in categories:
                # Normal on a new system: the source reads the category's events as they come.
                _warn_empty_category(projection, source.category, categories)
                continue  # no types to check them against yet
        if source.types:
            known = set(event_types(dsn, source.category)) | set(registered_types)
            unknown = [t for t in source.types if t not in known]
            if unknown:
                where = f"category {source.category!r}" if source.category else "the store"
                raise UnknownSourceError(
                    f"projection {projection}: event type {unknown[0]!r} is neither in "
                    f"{where} nor registered; known types: {', '.join(sorted(known)) or 'none'}"
                )


def check_delta_input(source: DeltaSource, *, projection: str) -> None:
    """A Delta input must be a Delta table lakefold can read, with the key columns:
    UnknownSourceError or MissingKeyError naming what is wrong (one line)."""
    from lakefold.spark.internals import check_delta_table

    try:
        check_delta_table(source)
    except DeltaInputColumnError as e:
        raise MissingKeyError(f"projection {projection}: {e}") from e
    except (NotADeltaTableError, DeltaInputError) as e:
        raise UnknownSourceError(f"projection {projection}: {e}") from e
