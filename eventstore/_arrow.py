"""Bulk reads of the global log as Arrow record batches, for Spark's Python workers.

``read_events_range(dsn, start, end)`` needs nothing but its (picklable) arguments: it opens
one short-lived connection, reads positions ``[start, end)`` (1-based, ``start`` inclusive,
``end`` exclusive) in pages, and yields ``pyarrow.RecordBatch``es with ``EVENTS_ARROW_SCHEMA``.
It reads only sequenced positions, so a range below ``head_position(dsn) + 1`` is final: the
same call returns the same events every time (unless streams in it are deleted meanwhile).
Payloads stay JSON text (``data``, ``metadata``), so nothing is decoded row by row in Python.
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
from lakefold.eventstore._reads import log_statement
from lakefold.eventstore._sequencer import sequence_once
from lakefold.schemas.events import STREAM_DELETED_TYPE

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

_COLUMNS: Final = sql.SQL(
    "b.first_position + e.ordinal, e.event_id::text, e.stream_id, e.stream_version, "
    "e.category, e.type, e.schema_version, e.data::text, e.metadata::text, "
    "e.correlation_id::text, e.causation_id::text, e.recorded_at"
)


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(
            columns, EVENTS_ARROW_SCHEMA, strict=True)],
        schema=EVENTS_ARROW_SCHEMA,
    )


def read_events_range(dsn: str, start: int, end: int, *, category: str | None = None,
                      types: Sequence[str] | None = None, include_deleted: bool = False,
                      batch_size: int = 50_000) -> Iterator[pa.RecordBatch]:
    """Yield the events at global positions ``[start, end)`` as Arrow record batches of at most
    ``batch_size`` rows, in position order, optionally only one category and/or some types
    (deletion records always pass a type filter). Empty ranges yield nothing.

    Positions are 1-based and dense; erased (hard-deleted) and hidden (soft-deleted) events
    leave holes, so a batch may hold fewer rows than its position span."""
    check_position(start, "start")
    check_position(end, "end")
    check_limit(batch_size)
    category = None if category is None else check_category(category)
    checked = check_types(types)
    type_list = None if checked is None else [*checked, STREAM_DELETED_TYPE]
    if end <= start:
        return
    statement = log_statement(_COLUMNS, category=category is not None,
                              types=type_list is not None, include_deleted=include_deleted,
                              bounded=True)
    params: dict[str, Any] = {"from": max(start, 1), "to": end, "limit": batch_size,
                              "category": category, "types": type_list}
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(statement, params, binary=True).fetchall()
            if rows:
                yield _batch(rows)
            if len(rows) < batch_size:
                return
            params["from"] = rows[-1][0] + 1


def head_position(dsn: str) -> int:
    """The last global position visible to readers (0 for an empty store), after a sequencing
    round: every position up to it is final. Opens and closes one connection."""
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        return sequence_once(conn).head
