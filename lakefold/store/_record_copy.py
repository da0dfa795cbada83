"""Changelog records as binary ``COPY`` data, built column-wise: one Arrow kernel per field over
all records, not Python per row. Snapshot segments moved into rows (``_snapshot_segments``) and
derived streams (``_derived_streams``) write their records this way.

A record's fields are those of ``lakefold.changelog`` in the order ``position, ordinal,
commit_lsn, xid, commit_ts, stream_id, schema_version, op, key, before, after``; ``key`` is
the concatenated key fields (``_changelog_writer.encode_key``'s bytes), ``before`` and
``after`` text arrays of the row's values (NULL for an insert's before-image or a delete's
after-image).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.store._changelog_writer import (
    COPY_HEADER,
    COPY_TRAILER,
    NULL_FIELD,
    TEXT_OID,
)

#: The columns of ``lakefold.changelog`` the data holds, in order.
RECORD_COLUMNS: Final = ("position, ordinal, commit_lsn, xid, commit_ts, stream_id, "
                         "schema_version, op, key, before, after")
# Binary COPY stores a timestamptz as microseconds since 2000-01-01 UTC (PostgreSQL's epoch).
_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_ARRAY_HEADER: Final = struct.Struct(">iiiii")  # ndim, flags, element oid, dim, lbound


@dataclass(frozen=True)
class Records:
    """``n`` records of one stream and commit, numbered from ``first_position`` and
    ``first_ordinal``. ``ops``: one op letter for all, or one per record; ``keys``: the key
    columns' texts (none: no key); ``before``/``after``: every column's texts, and which
    records have that image (None: all do)."""

    stream_id: int
    schema_version: int
    first_position: int
    first_ordinal: int
    commit_lsn: int
    commit_ts: datetime
    ops: str | pa.Array
    keys: Sequence[pa.Array]
    before: Sequence[pa.Array] | None = None
    has_before: pa.Array | None = None
    after: Sequence[pa.Array] | None = None
    has_after: pa.Array | None = None


def record_copy(records: Records, n: int) -> bytes:
    """The binary COPY data (header, rows, trailer) of ``records``."""
    if n == 0:
        return COPY_HEADER + COPY_TRAILER
    r = records
    positions = np.arange(r.first_position, r.first_position + n, dtype=np.int64)
    ordinals = np.arange(r.first_ordinal, r.first_ordinal + n, dtype=np.int64)
    op: pa.Scalar | pa.Array = pa.scalar(struct.pack(">i", 1) + r.ops.encode()) \
        if isinstance(r.ops, str) else nullable_field(r.ops.cast(pa.binary()))
    key: pa.Scalar | pa.Array = nullable_field(pc.binary_join_element_wise(
        *(text_field(k) for k in r.keys), b"")) if r.keys else pa.scalar(NULL_FIELD)
    fields = [
        pa.scalar(struct.pack(">h", 11)),
        _int8_field(positions), _int8_field(ordinals),
        _constant(">iq", 8, r.commit_lsn), _constant(">iq", 8, 0),
        _constant(">iq", 8, (r.commit_ts - _PG_EPOCH) // timedelta(microseconds=1)),
        _constant(">ii", 4, r.stream_id), _constant(">ii", 4, r.schema_version),
        op, key, _text_array(r.before, r.has_before), _text_array(r.after, r.has_after),
    ]
    rows = pc.binary_join_element_wise(*fields, b"")
    offsets = rows.buffers()[1]
    start, end = (np.frombuffer(offsets, dtype=np.int32)[[rows.offset, rows.offset + n]]
                  if offsets is not None else (0, 0))
    body = rows.buffers()[2]
    return COPY_HEADER + (body[start:end].to_pybytes() if body is not None else b"") + \
        COPY_TRAILER


def _text_array(columns: Sequence[pa.Array] | None, present: pa.Array | None
                ) -> pa.Scalar | pa.Array:
    """A text[] field of every record (NULL where not ``present``, or for all without
    ``columns``)."""
    if columns is None:
        return pa.scalar(NULL_FIELD)
    header = pa.scalar(_ARRAY_HEADER.pack(1, 0, TEXT_OID, len(columns), 1))
    elements = pc.binary_join_element_wise(*(text_field(c) for c in columns), b"")
    field = pc.binary_join_element_wise(
        _lengths(pc.add(pc.binary_length(elements), 20)), header, elements, b"")
    return field if present is None else pc.if_else(present, field, pa.scalar(NULL_FIELD))


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


def text_field(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A text column as binary COPY fields: length and UTF-8 bytes, or the NULL marker."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return nullable_field(column.cast(pa.binary()))


def nullable_field(values: pa.Array) -> pa.Array:
    """Binary values as binary COPY fields (length and bytes, or the NULL marker)."""
    return pc.binary_join_element_wise(_lengths(pc.binary_length(values)),
                                       pc.fill_null(values, b""), b"")
