"""Snapshot segments: a run of ``read`` records of a stream stored as one row.

An initial snapshot copies a table chunk by chunk. Written as one changelog row per source row,
a chunk cost the store a heap row, a primary-key entry and ~260 bytes of WAL per row, four to
eight times the work of reading the row. So each chunk is stored as one or a few rows of
``lakefold.changelog_segments`` instead:

``first_position .. last_position``  the records' positions (dense: a segment holds no gap);
``first_ordinal``                    the first record's ordinal, the next ones count up;
``commit_lsn``, ``commit_ts``        the snapshot's consistent point, as for every read record;
``schema_version``                   the stream's schema version the rows were read under;
``rows``                             the rows: one UTF-8 column per column of that version, in
                                     column order, holding the text form pgoutput sends
                                     (``_table_shape.TableShape.text_columns``), as one compressed
                                     Arrow IPC stream;
``keys``                             the key columns alone, in the same form, so the TOAST
                                     fill can find a key without reading the rows.

Every record in a segment is a ``read`` with xid 0, no before-image, and the key the capture
would give it (``_changelog_writer.encode_key`` of the key columns' texts).

Readers (``_changelog_store``) merge segments and changelog rows by position, so a segment is
invisible to consumers except through its smaller size. Compaction turns the segments it reaches
into ordinary changelog rows (``explode``) before it compacts their positions, and the TOAST fill
searches the segments after the rows (``latest_with_key``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.capture.store._changelog_writer import (
    CHANGELOG_COPY,
    COPY_HEADER,
    COPY_TRAILER,
    NULL_FIELD,
    TEXT_OID,
    encode_key,
)
from lakefold.capture.store.exceptions import CaptureLookupError, CaptureValueError, StoreError

# Binary COPY stores a timestamptz as microseconds since 2000-01-01 UTC (PostgreSQL's epoch).
_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_COMPRESSION: Final = pa.ipc.IpcWriteOptions(compression="zstd")
_ARRAY_HEADER: Final = struct.Struct(">iiiii")  # ndim, flags, element oid, dim, lbound
_EXPLODE_LOCK: Final = 0x6C667367  # "lfsg": advisory lock space, keyed by stream id

INSERT: Final = (
    "INSERT INTO lakefold.changelog_segments (stream_id, first_position, last_position, "
    "first_ordinal, commit_lsn, commit_ts, schema_version, keys, rows) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_HEADS: Final = (
    "SELECT first_position, last_position, first_ordinal, commit_lsn, commit_ts, "
    "schema_version FROM lakefold.changelog_segments WHERE stream_id = %s"
)


@dataclass(frozen=True, slots=True)
class Segment:
    """A segment's description (everything but its rows)."""

    stream_id: int
    first_position: int
    last_position: int
    first_ordinal: int
    commit_lsn: int
    commit_ts: datetime
    schema_version: int

    @property
    def size(self) -> int:
        return self.last_position - self.first_position + 1


def encode(table: pa.Table) -> bytes:
    """``table`` as one compressed Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_COMPRESSION) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def decode(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def write(cur: psycopg.Cursor[Any], segment: Segment, rows: pa.Table,
          key_indexes: Sequence[int]) -> None:
    """Store ``rows`` (text columns, ``segment.size`` of them) as ``segment``."""
    if rows.num_rows != segment.size:
        raise CaptureValueError(f"a segment of {segment.size} positions cannot hold "
                                f"{rows.num_rows} rows; seal one row per position")
    cur.execute(INSERT, (
        segment.stream_id, segment.first_position, segment.last_position,
        segment.first_ordinal, segment.commit_lsn, segment.commit_ts, segment.schema_version,
        encode(rows.select(list(key_indexes))), encode(rows)))


def _segments(cur: psycopg.Cursor[Any] | psycopg.Connection[Any], query: str,
              params: Sequence[Any]) -> list[Segment]:
    try:
        rows = cur.execute(_HEADS + query, params).fetchall()
    except psycopg.errors.UndefinedTable as e:
        raise StoreError(
            "the changelog store was installed by an older lakefold, without snapshot "
            "segments; upgrade it with ChangelogStore(dsn).install() (a capture run does it "
            "too)") from e
    return [Segment(int(params[0]), int(r[0]), int(r[1]), int(r[2]), int(r[3]), r[4],
                    int(r[5])) for r in rows]


def _rows(cur: psycopg.Cursor[Any] | psycopg.Connection[Any], segment: Segment) -> pa.Table:
    row = cur.execute(
        "SELECT rows FROM lakefold.changelog_segments WHERE stream_id = %s "
        "AND first_position = %s", (segment.stream_id, segment.first_position)).fetchone()
    if row is None:
        raise CaptureLookupError(f"segment {segment.first_position} of stream {segment.stream_id} "
                          "is gone (compacted meanwhile)")
    return decode(row[0])


def read_range(conn: psycopg.Connection[Any], stream_id: int, start: int, end: int,
               limit: int | None) -> Iterator[tuple[Segment, pa.Table]]:
    """The segments' records with ``start <= position < end`` in position order, at most
    ``limit`` of them: each segment with its rows sliced to the range (row ``i`` of a slice
    is position ``segment.first_position + i``)."""
    heads = _segments(conn, " AND last_position >= %s AND first_position < %s "
                      "ORDER BY first_position", (stream_id, start, end))
    left = limit
    for head in heads:
        if left is not None and left <= 0:
            return
        rows = _rows(conn, head)
        lo = max(start, head.first_position) - head.first_position
        hi = min(end - 1, head.last_position) - head.first_position + 1
        if left is not None:
            hi = min(hi, lo + left)
            left -= hi - lo
        yield Segment(stream_id, head.first_position + lo, head.first_position + hi - 1,
                      head.first_ordinal + lo, head.commit_lsn, head.commit_ts,
                      head.schema_version), rows.slice(lo, hi - lo)


def record_keys(rows: pa.Table, key_indexes: Sequence[int]) -> list[bytes | None]:
    """The ``key`` of each record (see the module docstring)."""
    if not key_indexes:
        return [None] * rows.num_rows
    columns = [rows.column(i).to_pylist() for i in key_indexes]
    return [encode_key(values) for values in zip(*columns, strict=True)]


def latest_with_key(cur: psycopg.Cursor[Any], stream_id: int, key: Sequence[str | None],
                    *, above: int, below: int) -> tuple[int, int, list[str | None]] | None:
    """The last record of ``key`` (its key columns' texts) in the segments between positions
    ``above`` and ``below`` (exclusive): (position, schema version, the row's texts)."""
    if not key:
        return None
    heads = _segments(cur, " AND last_position > %s AND first_position < %s "
                      "ORDER BY first_position DESC", (stream_id, above, below))
    for head in heads:
        row = cur.execute(
            "SELECT keys FROM lakefold.changelog_segments WHERE stream_id = %s "
            "AND first_position = %s", (stream_id, head.first_position)).fetchone()
        if row is None:
            continue
        keys = decode(row[0])
        if keys.num_columns != len(key):
            continue  # another key (a primary-key change): records of another identity
        mask = functools.reduce(pc.and_, (
            pc.is_null(column) if value is None else pc.equal(column, value)
            for column, value in zip(keys.columns, key, strict=True)))
        found = pc.indices_nonzero(pc.fill_null(mask, False))
        for index in reversed(found.to_pylist()):
            position = head.first_position + index
            if above < position < below:
                rows = _rows(cur, head)
                return position, head.schema_version, [
                    rows.column(c)[index].as_py() for c in range(rows.num_columns)]
    return None


def key_indexes(cur: psycopg.Cursor[Any] | psycopg.Connection[Any], stream_id: int,
                version: int) -> list[int]:
    """The 0-based indexes of the key columns of the stream's schema ``version``."""
    row = cur.execute(
        "SELECT columns FROM lakefold.changelog_schemas WHERE stream_id = %s AND version = %s",
        (stream_id, version)).fetchone()
    return [i for i, c in enumerate(row[0] if row else ()) if c.get("key")]


def hold(cur: psycopg.Cursor[Any], stream_id: int) -> None:
    """Keep ``explode`` away from the stream's segments until the current transaction ends.

    A transaction that looks a record up in the rows and then in the segments, one statement
    after the other under READ COMMITTED (the TOAST fill), would otherwise miss a segment
    turned into rows between the two statements."""
    cur.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", (_EXPLODE_LOCK, stream_id))


def explode(cur: psycopg.Cursor[Any], stream_id: int, lo: int, hi: int) -> int:
    """Turn the segments holding positions in ``(lo, hi]`` into changelog rows (the same
    records, written with one binary COPY each); returns how many. Waits for the
    transactions that ``hold`` the stream's segments."""
    heads = _segments(cur, " AND last_position > %s AND first_position <= %s "
                      "ORDER BY first_position", (stream_id, lo, hi))
    if heads:
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_EXPLODE_LOCK, stream_id))
    moved = 0
    for head in heads:
        data = binary_copy(head, _rows(cur, head),
                            key_indexes(cur, stream_id, head.schema_version))
        with cur.copy(CHANGELOG_COPY) as copy:
            copy.write(data)
        cur.execute("DELETE FROM lakefold.changelog_segments WHERE stream_id = %s "
                    "AND first_position = %s", (stream_id, head.first_position))
        moved += head.size
    return moved


def binary_copy(segment: Segment, rows: pa.Table, key_indexes: Sequence[int]) -> bytes:
    """The segment's records as the binary COPY data of ``_changelog_writer.CHANGELOG_COPY``, built
    column-wise (one Arrow kernel per field, not Python per row)."""
    n = rows.num_rows
    positions = np.arange(segment.first_position, segment.first_position + n, dtype=np.int64)
    ordinals = np.arange(segment.first_ordinal, segment.first_ordinal + n, dtype=np.int64)
    texts = [_text_field(rows.column(i)) for i in range(rows.num_columns)]
    after = pc.binary_join_element_wise(*texts, b"") if texts else pa.nulls(n, pa.binary())
    array_header = _ARRAY_HEADER.pack(1, 0, TEXT_OID, rows.num_columns, 1)
    key = pc.binary_join_element_wise(*(texts[i] for i in key_indexes), b"") \
        if key_indexes else None
    row_fields = [
        pa.scalar(struct.pack(">h", 11)),
        _int8_field(positions), _int8_field(ordinals),
        _constant(">iq", 8, segment.commit_lsn), _constant(">iq", 8, 0),
        _constant(">iq", 8, (segment.commit_ts - _PG_EPOCH) // timedelta(microseconds=1)),
        _constant(">ii", 4, segment.stream_id), _constant(">ii", 4, segment.schema_version),
        pa.scalar(b"\x00\x00\x00\x01r"),
        _nullable_field(key) if key is not None else pa.scalar(NULL_FIELD),
        pa.scalar(NULL_FIELD),
        pc.binary_join_element_wise(_lengths(pc.add(pc.binary_length(after), 20)),
                                    pa.scalar(array_header), after, b""),
    ]
    records = pc.binary_join_element_wise(*row_fields, b"")
    offsets = records.buffers()[1]
    start, end = (np.frombuffer(offsets, dtype=np.int32)[[records.offset,
                                                          records.offset + n]]
                  if offsets is not None else (0, 0))
    body = records.buffers()[2]
    return COPY_HEADER + (body[start:end].to_pybytes() if body is not None else b"") + \
        COPY_TRAILER


def _lengths(lengths: pa.Array) -> pa.Array:
    """Each value as a 4-byte big-endian binary (-1 for null)."""
    values = np.asarray(pc.fill_null(lengths, -1).to_numpy(zero_copy_only=False),
                        dtype=">i4")
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(4), len(values), [None, pa.py_buffer(values.tobytes())]).cast(pa.binary())


def _int8_field(values: np.ndarray) -> pa.Array:
    packed = np.empty(len(values), dtype=[("length", ">i4"), ("value", ">i8")])
    packed["length"] = 8
    packed["value"] = values
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(12), len(values), [None, pa.py_buffer(packed.tobytes())]).cast(pa.binary())


def _constant(fmt: str, length: int, value: int) -> pa.Scalar:
    return pa.scalar(struct.pack(fmt, length, value))


def _text_field(column: pa.ChunkedArray) -> pa.Array:
    """A text column as binary COPY fields: length and UTF-8 bytes, or the NULL marker."""
    return _nullable_field(column.combine_chunks().cast(pa.binary()))


def _nullable_field(values: pa.Array) -> pa.Array:
    """Binary values as binary COPY fields (length and bytes, or the NULL marker)."""
    return pc.binary_join_element_wise(_lengths(pc.binary_length(values)),
                                       pc.fill_null(values, b""), b"")

