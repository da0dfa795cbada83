"""Bulk reads of the global log as Arrow record batches, for Spark's Python workers.

``read_events_range(dsn, start, end)`` needs nothing but its (picklable) arguments: it opens
one short-lived connection, reads positions ``[start, end)`` (1-based, ``start`` inclusive,
``end`` exclusive) in pages, and yields ``pyarrow.RecordBatch``es with ``EVENTS_ARROW_SCHEMA``.
It reads only sequenced positions, so a range below ``head_position(dsn) + 1`` is final: the
same call returns the same events every time (unless streams in it are deleted meanwhile).
Payloads stay JSON text (``data``, ``metadata``), so nothing is decoded row by row in Python.

``events_range_select(conn, start, end)`` is the same read as one literal SELECT, for bulk
consumers that move the rows themselves (``COPY (...) TO STDOUT``, Spark's reader): it follows
the store's tables, so they never need its private statements.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import psycopg
import pyarrow as pa
from psycopg import sql

from lakefold.dsn import mask_dsn
from lakefold.eventstore._model import check_category, check_limit, check_position, check_types
from lakefold.eventstore._postgres import translate_errors
from lakefold.eventstore._reads import log_statement, page_end, with_deletion_records
from lakefold.eventstore._sequencer import one_row, sequence_once

#: The columns of every batch ``read_events_range`` yields.
EVENTS_ARROW_SCHEMA: Final = pa.schema([
    pa.field("position", pa.int64(), nullable=False),
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("stream_id", pa.string(), nullable=False),
    pa.field("stream_version", pa.int64(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("type", pa.string(), nullable=False),
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("data", pa.string(), nullable=False),
    pa.field("metadata", pa.string(), nullable=False),
    pa.field("correlation_id", pa.string()),
    pa.field("causation_id", pa.string()),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
])

#: The columns of ``EVENTS_ARROW_SCHEMA``, in its order (``recorded_at`` a timestamptz).
_COLUMNS: Final = sql.SQL(
    "b.first_position + e.ordinal, e.event_id::text, e.stream_id, e.stream_version, "
    "e.category, e.type, e.schema_version, e.data::text, e.metadata::text, "
    "e.correlation_id::text, e.causation_id::text, e.recorded_at"
)


_CURSOR: Final = "SELECT last_position FROM lakefold.event_sequencer"


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(
            columns, EVENTS_ARROW_SCHEMA, strict=True)],
        schema=EVENTS_ARROW_SCHEMA,
    )


def _checked_read(start: int, end: int, category: str | None, types: Sequence[str] | None,
                  include_deleted: bool) -> tuple[str | None, list[str] | None, sql.Composed]:
    """The checked category and type filter (deletion records added) of a range read, and
    its statement."""
    check_position(start, "start")
    check_position(end, "end")
    category = None if category is None else check_category(category)
    type_list = with_deletion_records(check_types(types))
    statement = log_statement(_COLUMNS, category=category is not None,
                              types=type_list is not None, include_deleted=include_deleted,
                              bounded=True)
    return category, type_list, statement


def events_range_select(conn: psycopg.Connection[Any], start: int, end: int, *,
                        category: str | None = None, types: Sequence[str] | None = None,
                        include_deleted: bool = False) -> sql.Composed:
    """One SELECT, its parameters inlined as literals (so it can be wrapped in ``COPY (...) TO
    STDOUT``, which takes no bind parameters), of what ``read_events_range`` reads: the events
    at positions ``[start, end)`` in position order, with the same filters, and columns named
    and ordered like ``EVENTS_ARROW_SCHEMA`` (``recorded_at`` a ``timestamptz``). It reads
    only sequenced positions. ``conn`` only quotes the literals; nothing runs on it."""
    category, type_list, statement = _checked_read(start, end, category, types,
                                                   include_deleted)
    params = {"from": max(start, 1), "to": max(end, start), "limit": max(end - start, 1),
              "category": category, "types": type_list}
    literal = psycopg.ClientCursor(conn).mogrify(statement, params)
    return sql.SQL("SELECT * FROM ({select}) AS s({names})").format(
        select=sql.SQL(literal),  # mogrify quoted every value
        names=sql.SQL(", ").join(sql.Identifier(n) for n in EVENTS_ARROW_SCHEMA.names))


def read_events_range(dsn: str, start: int, end: int, *, category: str | None = None,
                      types: Sequence[str] | None = None, include_deleted: bool = False,
                      batch_size: int = 50_000) -> Iterator[pa.RecordBatch]:
    """Yield the events at global positions ``[start, end)`` as Arrow record batches of at most
    ``batch_size`` rows, in position order, optionally only one category and/or some types
    (deletion records always pass a type filter). Empty ranges yield nothing.

    Positions are 1-based and dense; erased (hard-deleted) and hidden (soft-deleted) events
    leave holes, so a batch may hold fewer rows than its position span."""
    category, type_list, statement = _checked_read(start, end, category, types,
                                                   include_deleted)
    check_limit(batch_size)
    if end <= start:
        return
    unfiltered = category is None and type_list is None
    position = max(start, 1)
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        if unfiltered:  # pages of positions: stop at the sequencer's cursor, not at ``end``
            end = min(end, int(one_row(conn.execute(_CURSOR).fetchone())[0]) + 1)
        while position < end:
            to = page_end(position, batch_size, end) if unfiltered else end
            rows = conn.execute(statement, {
                "from": position, "to": to, "limit": batch_size, "category": category,
                "types": type_list}, binary=True).fetchall()
            if rows:
                yield _batch(rows)
            if unfiltered:
                position = to
            elif len(rows) < batch_size:
                return
            else:
                position = rows[-1][0] + 1


def head_position(dsn: str) -> int:
    """The last global position visible to readers (0 for an empty store), after a sequencing
    round: every position up to it is final. Opens and closes one connection."""
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        return sequence_once(conn).head
