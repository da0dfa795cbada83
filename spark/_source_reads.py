"""The source layer's door to the stores: listing inputs, heads, typed range reads.

Everything a reader needs from the changelog store (``lakefold.capture``) and the event store
(``lakefold.eventstore``) goes through these functions: an input (``_source_inputs``) has a
*head* (its last visible position) and a range ``[start, end)`` of positions reads as Arrow
record batches with the record metadata columns in front (``_source_columns``).

All functions take plain arguments (a DSN, an input) so they run in Spark's Python workers too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from lakefold.spark._source_columns import META_FIELDS, changelog_records, event_records
from lakefold.spark._source_inputs import ChangelogSource, DeltaSource, EventSource, Source
from lakefold.spark._source_truncates import Truncate
from lakefold.spark.exceptions import SourceUnavailableError

# --------------------------------------------------------------------------------- events


def event_categories(dsn: str) -> list[str]:
    """Categories that have at least one stream in the event store."""
    from lakefold.eventstore import list_categories

    return _ask_events(list_categories, dsn)


def event_types(dsn: str, category: str | None) -> list[str]:
    """Event types present in the store (in one category, or anywhere)."""
    from lakefold.eventstore import list_event_types

    return _ask_events(list_event_types, dsn, category)


def _ask_events(question: Callable[..., list[str]], dsn: str, *args: Any) -> list[str]:
    from lakefold.eventstore import EventStoreUnavailableError

    try:
        return question(dsn, *args)
    except EventStoreUnavailableError as e:
        raise SourceUnavailableError(f"{e}; check the store DSN") from e


_handles: dict[tuple[str, str], Any] = {}
_handles_lock = threading.Lock()


def _handle(kind: str, dsn: str) -> Any:
    """A long-lived store object per DSN (heads are asked every trigger: no reconnects)."""
    key = (kind, dsn)
    handle = _handles.get(key)
    if handle is None:
        if kind == "events":
            from lakefold.eventstore import EventStore

            handle = EventStore(dsn)
        else:
            from lakefold.store import ChangelogStore

            handle = ChangelogStore(dsn)
        _handles[key] = handle
    return handle


def _drop_handle(kind: str, dsn: str) -> None:
    handle = _handles.pop((kind, dsn), None)
    if handle is not None:
        handle.close()


def events_head(dsn: str) -> int:
    """The last global position visible to readers (0 when the store is empty)."""
    with _handles_lock:
        try:
            return int(_handle("events", dsn).head())
        except Exception:
            _drop_handle("events", dsn)  # reconnect next time
            raise


def read_events(dsn: str, source: EventSource, start: int, end: int, *,
                columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Events at positions ``[start, end)`` of ``source`` with the metadata columns; with
    ``columns``, only those event columns (they must include what the metadata columns are
    made from: ``EVENT_META_SOURCE_COLUMNS``).

    A rebuild replays the whole log through here: sealed ranges come from their segments."""
    from lakefold.eventstore.arrow import read_events_range

    for batch in read_events_range(dsn, max(start, 1), end, category=source.category,
                                   types=list(source.types) or None, columns=columns):
        yield event_records(batch)


def event_columns() -> tuple[str, ...]:
    """The event store's columns, as ``read_events`` returns them after the metadata."""
    from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA

    return tuple(EVENTS_ARROW_SCHEMA.names)


def events_arrow_schema() -> pa.Schema:
    from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA

    return pa.schema([*META_FIELDS, *EVENTS_ARROW_SCHEMA])


# --------------------------------------------------------------------------------- changelog


def changelog_streams(dsn: str) -> list[str]:
    """The changelog streams (``schema.table``) in the store."""
    from lakefold.store import ChangelogStore

    with ChangelogStore(dsn) as store:
        return [info.name for info in store.streams()]


def changelog_key_columns(dsn: str, stream: str) -> tuple[str, ...]:
    """The columns a changelog stream's records are keyed by (its newest schema version)."""
    from lakefold.store import ChangelogStore

    with ChangelogStore(dsn) as store:
        return store.stream_schema(stream).key_columns


def changelog_head(dsn: str, stream: str) -> int:
    """The last position of a changelog stream that readers may see (0 when empty)."""
    with _handles_lock:
        try:
            return int(_handle("changelog", dsn).head(stream))
        except Exception:
            _drop_handle("changelog", dsn)  # reconnect next time
            raise


def changelog_truncates(dsn: str, stream: str, start: int, end: int) -> list[Truncate]:
    """The truncate records of a changelog stream at positions ``[start, end)``, in order."""
    with _handles_lock:
        try:
            found = _handle("changelog", dsn).truncates(stream, start, end)
        except Exception:
            _drop_handle("changelog", dsn)  # reconnect next time
            raise
    return [Truncate(position=int(p), at=at) for p, at in found]


def changelog_arrow_schema(dsn: str, stream: str) -> pa.Schema:
    """The columns a changelog read yields: the metadata columns, capture's own change columns
    (``_op``, ``_commit_lsn``, ...) and the table's typed columns (newest schema version)."""
    from lakefold.store import ChangelogStore

    with ChangelogStore(dsn) as store:
        empty = store.read(stream, from_position=2**62, limit=1)
    return changelog_records(empty.to_batches()[0] if empty.num_rows else
                             pa.RecordBatch.from_pylist([], schema=empty.schema), stream).schema


def read_changelog(dsn: str, source: ChangelogSource, start: int, end: int
                   ) -> Iterator[pa.RecordBatch]:
    """Changelog records at positions ``[start, end)`` with the metadata columns."""
    from lakefold.store import read_changelog_range

    for batch in read_changelog_range(dsn, source.table, max(start, 1), end):
        yield changelog_records(batch, source.table)


# --------------------------------------------------------------------------------- any input


def head(dsn: str, source: Source) -> int:
    """The input's last visible position."""
    if isinstance(source, EventSource):
        return events_head(dsn)
    if isinstance(source, DeltaSource):
        from lakefold.spark import _source_delta

        return _source_delta.head(source)
    return changelog_head(dsn, source.table)


def read(dsn: str, source: Source, start: int, end: int, *,
         columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Records at ``[start, end)`` of an input; ``columns`` prunes event columns."""
    if isinstance(source, EventSource):
        return read_events(dsn, source, start, end, columns=columns)
    if isinstance(source, DeltaSource):
        from lakefold.spark import _source_delta
        from lakefold.spark._source_positions import PositionRange

        return _source_delta.read_range(source, PositionRange(start, end),
                                        arrow_schema(dsn, source))
    return read_changelog(dsn, source, start, end)


def records_between(source: Source, start: int, end: int) -> int:
    """About how many records an input holds at positions ``[start, end)``: exactly the
    positions for the stores' inputs (dense, up to compaction's holes); for a Delta table, its
    versions' change rows as their commits count them (statistics or Parquet footers)."""
    if isinstance(source, DeltaSource):
        from lakefold.spark import _source_delta

        return _source_delta.batch_rows(source, start, end)
    return max(0, end - max(start, 1))


def arrow_schema(dsn: str, source: Source) -> pa.Schema:
    """The Arrow schema of an input's records (metadata columns first)."""
    if isinstance(source, EventSource):
        return events_arrow_schema()
    if isinstance(source, DeltaSource):
        from lakefold.spark import _source_delta

        return _source_delta.arrow_schema(source)
    return changelog_arrow_schema(dsn, source.table)
