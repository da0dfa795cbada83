"""Bulk reads of the global log as Arrow record batches, for Spark's Python workers and rebuilds.

``read_events_range(dsn, start, end)`` needs nothing but its (picklable) arguments: it opens
its own connections, reads positions ``[start, end)`` (1-based, ``start`` inclusive, ``end``
exclusive) and yields ``pyarrow.RecordBatch``es of ``EVENTS_ARROW_SCHEMA`` (or of the
``columns`` asked for). It reads only sequenced positions, so a range below
``head_position(dsn) + 1`` is final: the same call returns the same events every time (unless
streams in it are deleted meanwhile). Payloads stay JSON text (``data``, ``metadata``).

Where the events come from. Sealed ranges (``_segments.py``) are read from their segments:
one statement per run of consecutive segments, decompressing only the columns asked for. The
rest (the unsealed tail, a range whose segment a deletion dropped, and every read with a
category or type filter or with hidden events) is the store's own log read
(``events_range_select``) run through the ADBC PostgreSQL driver, which fetches it with a
binary ``COPY ... TO STDOUT`` and decodes it into Arrow in C++. Both run in one REPEATABLE
READ snapshot, so a segment dropped or sealed meanwhile can neither hide events nor show them
twice. Tests compare the two sources row for row.

``events_range_select(conn, start, end)`` is the log read as one literal SELECT, for bulk
consumers that move the rows themselves (``COPY (...) TO STDOUT``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final, TypeVar

import psycopg
import pyarrow as pa
from psycopg import sql

from lakefold.core import adbc
from lakefold.core.dsn import mask_dsn
from lakefold.eventstore import _segments
from lakefold.eventstore._model import check_category, check_limit, check_position, check_types
from lakefold.eventstore._readers import read_connections
from lakefold.eventstore._reads import log_statement, with_deletion_records
from lakefold.eventstore._sequencer import sequence_once
from lakefold.eventstore._translate import translate_errors
from lakefold.eventstore.exceptions import (
    EventStoreNotInstalledError,
    EventStoreTerminalError,
    EventStoreUnavailableError,
    InvalidRequestError,
)

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


def events_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """``EVENTS_ARROW_SCHEMA``, or the part of it with ``columns`` (in the schema's order);
    InvalidRequestError names unknown columns."""
    if columns is None:
        return EVENTS_ARROW_SCHEMA
    unknown = sorted(set(columns) - set(EVENTS_ARROW_SCHEMA.names))
    if unknown:
        raise InvalidRequestError(
            f"unknown event column(s) {', '.join(unknown)}; the columns are "
            f"{', '.join(EVENTS_ARROW_SCHEMA.names)}"
        )
    return pa.schema([f for f in EVENTS_ARROW_SCHEMA if f.name in set(columns)])


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
    STDOUT``, which takes no bind parameters), of the log read: the events at positions
    ``[start, end)`` in position order, optionally of one category and/or some types (deletion
    records always pass a type filter), soft-deleted ones hidden unless ``include_deleted``,
    with columns named and ordered like ``EVENTS_ARROW_SCHEMA`` (``recorded_at`` a
    ``timestamptz``). It reads only sequenced positions. ``conn`` only quotes the literals;
    nothing runs on it."""
    category, type_list, statement = _checked_read(start, end, category, types,
                                                   include_deleted)
    params = {"from": max(start, 1), "to": max(end, start), "limit": max(end - start, 1),
              "category": category, "types": type_list}
    literal = psycopg.ClientCursor(conn).mogrify(statement, params)
    return sql.SQL("SELECT * FROM ({select}) AS s({names})").format(
        select=sql.SQL(literal),  # mogrify quoted every value
        names=sql.SQL(", ").join(sql.Identifier(n) for n in EVENTS_ARROW_SCHEMA.names))


_Columns = TypeVar("_Columns", pa.RecordBatch, pa.Table)


def conformed(batch: _Columns, schema: pa.Schema) -> _Columns:
    """``batch`` under ``schema`` (ADBC marks every column nullable and adds field metadata)."""
    if batch.schema.types == schema.types:
        return type(batch).from_arrays(batch.columns, schema=schema)
    return batch.cast(schema)


def _fetch(reader: adbc.Connection, statement: str, masked_dsn: str
           ) -> Iterator[pa.RecordBatch]:
    """The statement's batches, ADBC's errors translated."""
    try:
        yield from reader.batches(statement)
    except adbc.ProgrammingError as e:
        if getattr(e, "sqlstate", None) == "42P01":  # undefined_table
            raise EventStoreNotInstalledError(
                f"the event store at {masked_dsn} is not installed, or was installed by an "
                "older lakefold; run `lakefold events install` or EventStore(dsn).install()"
            ) from e
        raise EventStoreTerminalError(f"reading events from {masked_dsn} failed: {e}") from e
    except adbc.Error as e:
        raise EventStoreUnavailableError(f"reading events from {masked_dsn} failed: {e}") from e


def read_rows(reader: adbc.Connection, conn: psycopg.Connection[Any], start: int, end: int,
              *, category: str | None = None, types: Sequence[str] | None = None,
              include_deleted: bool = False, schema: pa.Schema = EVENTS_ARROW_SCHEMA
              ) -> Iterator[pa.RecordBatch]:
    """The log read of ``[start, end)`` as rows (one binary COPY through ``reader``; ``conn``
    quotes its literals), as batches of ``schema``."""
    select = sql.SQL("SELECT {columns} FROM ({select}) AS s").format(
        columns=sql.SQL(", ").join(sql.Identifier("s", n) for n in schema.names),
        select=events_range_select(conn, start, end, category=category, types=types,
                                   include_deleted=include_deleted),
    ).as_string(conn)
    for batch in _fetch(reader, select, mask_dsn(conn.info.dsn)):
        if batch.num_rows:
            yield conformed(batch, schema)


def _runs(bounds: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
    """``bounds`` (sorted segment ranges) grouped into runs of adjacent segments."""
    run: list[tuple[int, int]] = []
    for segment in bounds:
        if run and run[-1][1] != segment[0]:
            yield run
            run = []
        run.append(segment)
    if run:
        yield run


def _segment_batches(table: pa.Table, schema: pa.Schema, shredded: bool
                     ) -> list[pa.RecordBatch]:
    """A decoded segment's batches of ``schema``, its shredded payload fields appended when
    asked for and present."""
    events = conformed(table.select(schema.names), schema)
    if shredded and _segments.PAYLOAD_FIELDS in table.column_names:
        events = events.append_column(_segments.PAYLOAD_FIELDS,
                                      table.column(_segments.PAYLOAD_FIELDS))
    batches: list[pa.RecordBatch] = events.to_batches()
    return batches


def _sealed_then_rows(reader: adbc.Connection, conn: psycopg.Connection[Any], start: int,
                      end: int, schema: pa.Schema, shredded: bool
                      ) -> Iterator[pa.RecordBatch]:
    """``[start, end)`` from its segments, and the gaps between them as rows, in position
    order, all in the reader's current snapshot."""
    masked = mask_dsn(conn.info.dsn)
    bounds = [(first, stop) for batch in _fetch(reader, _segments.bounds_statement(start, end),
                                                masked)
              for first, stop in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                     strict=True)]
    columns = list(dict.fromkeys(["position", *schema.names]))  # position: to slice by
    if shredded:
        columns.append(_segments.PAYLOAD_FIELDS)
    position = start
    for run in _runs(bounds):
        if position < run[0][0]:
            yield from read_rows(reader, conn, position, run[0][0], schema=schema)
        ranges = iter(run)
        for batch in _fetch(reader, _segments.data_statement(run[0][0], run[-1][0]), masked):
            for data in _segments.segment_data(batch):
                first, stop = next(ranges)
                table = _segments.decode(data, columns)
                if first < start or stop > end:
                    table = _segments.slice_positions(table, start, end)
                yield from _segment_batches(table, schema, shredded)
        position = run[-1][1]
    if position < end:
        yield from read_rows(reader, conn, position, end, schema=schema)


def _at_most(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if batch.num_rows <= rows:
            yield batch
        else:
            yield from (batch.slice(i, rows) for i in range(0, batch.num_rows, rows))


def read_events_range(dsn: str, start: int, end: int, *, category: str | None = None,
                      types: Sequence[str] | None = None, include_deleted: bool = False,
                      columns: Sequence[str] | None = None, batch_size: int = 65_536,
                      shredded: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield the events at global positions ``[start, end)`` as Arrow record batches of at most
    ``batch_size`` rows, in position order, optionally only one category and/or some types
    (deletion records always pass a type filter), only ``columns`` (fewer columns read
    faster). Empty ranges yield nothing. Raises EventStoreUnavailableError (retry) or
    EventStoreNotInstalledError.

    Positions are 1-based and dense; erased (hard-deleted) and hidden (soft-deleted) events
    leave holes, so a batch may hold fewer rows than its position span.

    ``shredded``: batches read from a sealed segment that has shredded payload fields
    (``_segments.py``) carry them as one more column, ``PAYLOAD_FIELDS``, a struct."""
    _checked_read(start, end, category, types, include_deleted)
    check_limit(batch_size)
    schema = events_schema(columns)
    start = max(start, 1)
    if end <= start:
        return
    with translate_errors(mask_dsn(dsn)), read_connections(dsn) as (conn, reader):
        if category is not None or types is not None or include_deleted:
            yield from _at_most(read_rows(reader, conn, start, end, category=category,
                                          types=types, include_deleted=include_deleted,
                                          schema=schema), batch_size)
            return
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield from _at_most(_sealed_then_rows(reader, conn, start, end, schema, shredded),
                            batch_size)
        reader.execute("ROLLBACK")  # read only: nothing to keep


def head_position(dsn: str, conn: psycopg.Connection[Any] | None = None) -> int:
    """The last global position visible to readers (0 for an empty store), after a sequencing
    round: every position up to it is final. On ``conn`` (an autocommit connection with tuple
    rows, outside a transaction) or on a connection opened and closed for it."""
    with translate_errors(mask_dsn(dsn)):
        if conn is not None:
            return sequence_once(conn).head
        with psycopg.connect(dsn, autocommit=True) as own:
            return sequence_once(own).head
