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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.store._changelog_writer import (
    CHANGELOG_COPY,
    encode_key,
)
from lakefold.store._record_copy import Records, record_copy
from lakefold.store.exceptions import CaptureLookupError, CaptureValueError, StoreError

_COMPRESSION: Final = pa.ipc.IpcWriteOptions(compression="zstd")
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
    """The segment's records as binary COPY data (``_record_copy``)."""
    columns = [rows.column(i) for i in range(rows.num_columns)]
    return record_copy(Records(
        segment.stream_id, segment.schema_version, segment.first_position,
        segment.first_ordinal, segment.commit_lsn, segment.commit_ts, "r",
        keys=[columns[i] for i in key_indexes], after=columns), rows.num_rows)
