"""The projections' one door to the stores: listing sources, heads, typed range reads.

Everything the projections layer needs from ``lakefold.capture`` (changelog streams) and
``lakefold.eventstore`` (events) goes through these functions, so the runner, the validation
and the Spark source speak one vocabulary: a source has a *head* (its last visible position)
and a range ``[start, end)`` of positions reads as Arrow record batches with the projection
metadata columns added:

``_position`` (long), ``_ts`` (timestamp, UTC: commit or record time), ``_type`` (event type,
or ``insert``/``update``/``delete``), ``_stream`` (event stream id, or the table) and
``_deleted`` (true for a changelog delete or a stream-deletion record).

All functions take plain arguments (a DSN, names) so they run in Spark's Python workers too.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core.dsn import error_text, mask_dsn
from lakefold.projections._model import ChangelogSource, EventSource, Source
from lakefold.projections._truncate import Truncate
from lakefold.projections.exceptions import CatalogUnavailableError, UnknownSourceError

META_FIELDS = [
    pa.field("_position", pa.int64(), nullable=False),
    pa.field("_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_type", pa.string()),
    pa.field("_stream", pa.string()),
    pa.field("_deleted", pa.bool_()),
]
_STREAM_DELETED = "$stream.deleted"
log = logging.getLogger(__name__)


def _connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        raise CatalogUnavailableError(
            f"the store at {mask_dsn(dsn)} is unreachable ({error_text(e)}); check the store "
            "DSN"
        ) from e


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
        raise CatalogUnavailableError(f"{e}; check the store DSN") from e


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
            from lakefold.capture import ChangelogStore

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
    made from: position, recorded_at, type, stream_id).

    A rebuild replays the whole log through here: sealed ranges come from their segments."""
    from lakefold.eventstore.arrow import read_events_range

    for batch in read_events_range(dsn, max(start, 1), end, category=source.category,
                                   types=list(source.types) or None, columns=columns):
        yield _event_meta(batch)


def event_columns() -> tuple[str, ...]:
    """The event store's columns, as ``read_events`` returns them after the metadata."""
    from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA

    return tuple(EVENTS_ARROW_SCHEMA.names)


def events_arrow_schema() -> pa.Schema:
    from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA

    return pa.schema([*META_FIELDS, *EVENTS_ARROW_SCHEMA])


def _event_meta(batch: pa.RecordBatch) -> pa.RecordBatch:
    types = batch.column("type")
    deleted = pc.equal(types, _STREAM_DELETED)
    arrays = [batch.column("position"), batch.column("recorded_at"), types,
              batch.column("stream_id"), deleted]
    return pa.RecordBatch.from_arrays([*arrays, *batch.columns],
                                      schema=pa.schema([*META_FIELDS, *batch.schema]))


# --------------------------------------------------------------------------------- changelog


def changelog_streams(dsn: str) -> list[str]:
    """The changelog streams (``schema.table``) in the store."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(dsn) as store:
        return [info.name for info in store.streams()]


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
    """The columns a changelog read yields: the metadata columns, capture's own metadata
    (``_op``, ``_commit_lsn``, ...) and the table's typed columns (newest schema version)."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(dsn) as store:
        empty = store.read(stream, from_position=2**62, limit=1)
    return changelog_meta(empty.to_batches()[0] if empty.num_rows else
                          pa.RecordBatch.from_pylist([], schema=empty.schema), stream).schema


def read_changelog(dsn: str, source: ChangelogSource, start: int, end: int
                   ) -> Iterator[pa.RecordBatch]:
    """Changelog records at positions ``[start, end)`` with the metadata columns."""
    from lakefold.capture import read_changelog_range

    for batch in read_changelog_range(dsn, source.table, max(start, 1), end):
        yield changelog_meta(batch, source.table)


def changelog_meta(batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
    """Add the metadata columns to a changelog batch: ``_type`` is insert (snapshot reads
    too), update, delete or truncate; ``_deleted`` is true for deletes."""
    op = batch.column("_op")
    kind = pc.if_else(pc.equal(op, "read"), "insert", op)
    meta = [batch.column("_position"),
            pc.cast(batch.column("_commit_ts"), pa.timestamp("us", tz="UTC")),
            kind.cast(pa.string()),
            pa.array([stream] * batch.num_rows, pa.string()),
            pc.equal(op, "delete")]
    skip = {f.name for f in META_FIELDS}
    rest = [(f, batch.column(i)) for i, f in enumerate(batch.schema) if f.name not in skip]
    return pa.RecordBatch.from_arrays(
        [*meta, *(c for _, c in rest)],
        schema=pa.schema([*META_FIELDS, *(f for f, _ in rest)]))


# --------------------------------------------------------------------------------- any source


def head(dsn: str, source: Source) -> int:
    """The source's last visible position."""
    if isinstance(source, EventSource):
        return events_head(dsn)
    return changelog_head(dsn, source.table)


def read(dsn: str, source: Source, start: int, end: int, *,
         columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Records at ``[start, end)`` of a source; ``columns`` prunes event columns."""
    if isinstance(source, EventSource):
        return read_events(dsn, source, start, end, columns=columns)
    return read_changelog(dsn, source, start, end)


def arrow_schema(dsn: str, source: Source) -> pa.Schema:
    if isinstance(source, EventSource):
        return events_arrow_schema()
    return changelog_arrow_schema(dsn, source.table)


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
        if isinstance(source, ChangelogSource):
            if streams is None:
                streams = changelog_streams(dsn)
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
