"""Derived streams: changelog streams lakefold writes itself (a view's output rows), with the
records, positions, heads, schema versions, compaction and durable readers of a captured
table's stream, so that whatever reads a captured table reads a view the same way.

A derived stream has one writer (the view generation that owns it), which appends a batch of
records in its own store transaction (``append``), together with whatever else that
transaction commits (the view's input states). Its records look like a captured table under
``REPLICA IDENTITY FULL``: inserts and updates carry the new row, updates and deletes the old
row as their before-image.

Values are stored as the text a typed read turns back into the same Arrow values
(``_arrow_columns.typed_array``); ``column_for`` names the column type of each Arrow type a
view may output, and refuses the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from lakefold.store._changelog_writer import NOTIFY_CHANNEL
from lakefold.store._record_copy import RECORD_COLUMNS, Records, record_copy
from lakefold.store._stream_schema import ColumnSchema, StreamSchema
from lakefold.store.exceptions import CaptureValueError, OwnershipError, StoreError

#: The ``slot_name`` of every derived stream (no capture slot has it).
DERIVED_SLOT: Final = "lakefold:derived"

# Arrow type id → (type oid, type name, kind) of the column a derived stream declares.
_SIMPLE: Final[dict[pa.DataType, tuple[int, str, str]]] = {
    pa.int16(): (21, "int2", "int2"),
    pa.int32(): (23, "int4", "int4"),
    pa.int64(): (20, "int8", "int8"),
    pa.float32(): (700, "float4", "float4"),
    pa.float64(): (701, "float8", "float8"),
    pa.string(): (25, "text", "text"),
    pa.large_string(): (25, "text", "text"),
    pa.bool_(): (16, "bool", "bool"),
    pa.date32(): (1082, "date", "date"),
    pa.timestamp("us"): (1114, "timestamp", "timestamp"),
    pa.timestamp("us", tz="UTC"): (1184, "timestamptz", "timestamptz"),
}
_NUMERIC_OID: Final = 1700


def column_for(field: pa.Field, *, key: bool) -> ColumnSchema:
    """The column a derived stream declares for an Arrow field."""
    found = _SIMPLE.get(field.type)
    if found is None and pa.types.is_timestamp(field.type) and field.type.tz is not None:
        found = _SIMPLE[pa.timestamp("us", tz="UTC")]
    if found is not None:
        oid, name, kind = found
        return ColumnSchema(field.name, oid, name, -1, key, kind)
    if pa.types.is_decimal(field.type) and field.type.precision <= 38:
        precision, scale = field.type.precision, field.type.scale
        return ColumnSchema(field.name, _NUMERIC_OID, "numeric",
                            ((precision << 16) | (scale & 0x7FF)) + 4, key, "numeric")
    raise CaptureValueError(
        f"column {field.name!r} has type {field.type}, which a view's output cannot hold; "
        "cast it to a number, string, boolean, date, timestamp or decimal")


def text_array(column: ColumnSchema, values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``values`` as the text ``typed_array`` reads back to the same values."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if column.kind == "bool":
        return pc.if_else(values, "t", "f")
    if column.kind == "timestamptz":
        values = pc.cast(values, pa.timestamp("us", tz="UTC"))
    return pc.cast(values, pa.string())


class DerivedStream:
    """One derived stream, by name (``schema.table`` like a captured table's)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create(self, conn: psycopg.Connection[Any], schema: pa.Schema,
               keys: Sequence[str]) -> StreamSchema:
        """Register the stream (if new) and ``schema`` as its newest version (if it differs);
        returns that version."""
        missing = [k for k in keys if k not in schema.names]
        if not keys or missing:
            raise StoreError(f"a derived stream needs key columns among its columns; "
                             f"{self.name} lacks {missing or 'a key'}")
        columns = tuple(column_for(f, key=f.name in keys) for f in schema)
        table_schema, _, table = self.name.rpartition(".")
        with conn.transaction():
            conn.execute(
                "INSERT INTO lakefold.changelog_streams (name, slot_name, source_database, "
                "source_schema, source_table) VALUES (%s, %s, '', %s, %s) "
                "ON CONFLICT (name) DO NOTHING", (self.name, DERIVED_SLOT, table_schema, table))
            row = conn.execute("SELECT stream_id, slot_name FROM lakefold.changelog_streams "
                               "WHERE name = %s FOR UPDATE", (self.name,)).fetchone()
            assert row is not None  # noqa: S101 - inserted above
            if row[1] != DERIVED_SLOT:
                raise OwnershipError(f"stream {self.name!r} is a captured table's (slot "
                                     f"{row[1]!r}); a view cannot write it")
            stream_id = int(row[0])
            latest = conn.execute(
                "SELECT version, columns FROM lakefold.changelog_schemas WHERE stream_id = %s "
                "ORDER BY version DESC LIMIT 1", (stream_id,)).fetchone()
            version = 1 if latest is None else int(latest[0])
            schema_out = StreamSchema(stream=self.name, version=version, database="",
                                      schema=table_schema, table=table, relation_oid=0,
                                      replica_identity="f", columns=columns)
            if latest is None or StreamSchema.columns_from_json(latest[1]) != columns:
                version = 1 if latest is None else version + 1
                schema_out = replace(schema_out, version=version)
                conn.execute(
                    "INSERT INTO lakefold.changelog_schemas (stream_id, version, relation_oid, "
                    "replica_identity, source_schema, source_table, columns, created_lsn) "
                    "VALUES (%s, %s, 0, 'f', %s, %s, %s::jsonb, 0)",
                    (stream_id, version, table_schema, table, schema_out.columns_json()))
                conn.execute("UPDATE lakefold.changelog_streams SET schema_version = %s "
                             "WHERE stream_id = %s", (version, stream_id))
        return schema_out

    def append(self, conn: psycopg.Connection[Any], schema: StreamSchema, *,
               upserts: pa.Table, old: pa.Table, deletes: pa.Table, commit_lsn: int,
               commit_ts: datetime) -> tuple[int, int]:
        """Append one batch: ``upserts`` (new rows; ``old`` holds the previous row of each,
        or nulls for an insert, row for row) and ``deletes`` (the rows that go), as records
        after the head, and move the head past them. Returns the positions ``[start, end)``.
        The caller's transaction commits them."""
        with conn.transaction():
            row = conn.execute("SELECT stream_id, head FROM lakefold.changelog_streams "
                               "WHERE name = %s AND slot_name = %s FOR UPDATE",
                               (self.name, DERIVED_SLOT)).fetchone()
            if row is None:
                raise StoreError(f"no derived stream {self.name!r}; create it first")
            stream_id, head = int(row[0]), int(row[1])
            start = head + 1
            n = upserts.num_rows + deletes.num_rows
            if not n:
                return start, start
            with conn.cursor() as cur, cur.copy(
                    f"COPY lakefold.changelog ({RECORD_COLUMNS}) FROM STDIN (FORMAT BINARY)"
                    ) as copy:
                copy.write(record_copy(_records(
                    schema, upserts, old, deletes, stream_id=stream_id, start=start,
                    commit_lsn=commit_lsn, commit_ts=commit_ts), n))
            end = start + n
            conn.execute("UPDATE lakefold.changelog_streams SET head = %s, last_commit_ts = %s "
                         "WHERE stream_id = %s", (end - 1, commit_ts, stream_id))
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, self.name))
        return start, end

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Delete the stream and everything the store keeps of it: records, segments, keys,
        schema versions, durable readers (idempotent; a captured table's stream is refused).
        Whatever still read it reads nothing more."""
        with conn.transaction():
            row = conn.execute("SELECT stream_id, slot_name FROM lakefold.changelog_streams "
                               "WHERE name = %s FOR UPDATE", (self.name,)).fetchone()
            if row is None:
                return
            if row[1] != DERIVED_SLOT:
                raise OwnershipError(f"stream {self.name!r} is a captured table's (slot "
                                     f"{row[1]!r}); only a derived stream is dropped here")
            for table in ("changelog", "changelog_segments", "changelog_keys"):
                conn.execute(sql.SQL("DELETE FROM {} WHERE stream_id = %s").format(
                    sql.Identifier("lakefold", table)), (row[0],))
            # schema versions, compaction state and readers go with the row (ON DELETE CASCADE)
            conn.execute("DELETE FROM lakefold.changelog_streams WHERE stream_id = %s",
                         (row[0],))


def _records(schema: StreamSchema, upserts: pa.Table, old: pa.Table, deletes: pa.Table, *,
             stream_id: int, start: int, commit_lsn: int, commit_ts: datetime) -> Records:
    """The records of a batch: an update for each upsert with an old row (an insert without;
    ``old`` may be empty: all inserts), then a delete for each deleted row; keys and images
    as the texts a typed read reads back."""
    def columns(table: pa.Table) -> list[pa.Array]:
        return [text_array(c, table.column(c.name)) for c in schema.columns]

    width = len(schema.columns)
    new, gone = columns(upserts), columns(deletes)
    before = columns(old) if old.num_rows else [pa.nulls(upserts.num_rows, pa.string())] * width
    updated = pa.array(np.zeros(upserts.num_rows, dtype=bool))
    for values in before:  # an old row with any value: an update
        updated = pc.or_(updated, pc.is_valid(values))
    key_at = [i for i, c in enumerate(schema.columns) if c.key]
    nulls = [pa.nulls(deletes.num_rows, pa.string())] * width
    return Records(
        stream_id, schema.version, start, start, commit_lsn, commit_ts,
        ops=pa.concat_arrays([pc.if_else(updated, "u", "i"),
                              pa.array(["d"] * deletes.num_rows, pa.string())]),
        keys=[pa.concat_arrays([new[k], gone[k]]) for k in key_at],
        before=[pa.concat_arrays([b, d]) for b, d in zip(before, gone, strict=True)],
        has_before=pa.concat_arrays([updated, pa.array(np.ones(deletes.num_rows, dtype=bool))]),
        after=[pa.concat_arrays([a, z]) for a, z in zip(new, nulls, strict=True)],
        has_after=pa.concat_arrays([pa.array(np.ones(upserts.num_rows, dtype=bool)),
                                    pa.array(np.zeros(deletes.num_rows, dtype=bool))]))
