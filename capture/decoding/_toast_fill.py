"""Unchanged TOASTed values: never leave a placeholder in a record.

When an UPDATE does not touch a large (TOASTed, out-of-line) column, pgoutput does not send its
value, only the marker "unchanged" (``'u'``). Two cases:

* ``REPLICA IDENTITY FULL``: the message's old image carries the value (the server inlines it),
  so the decoder copies it into the new image right away (``fill_from_before``).
* otherwise: the record is written with the column NULL, and a ``ToastFill`` action of the same
  store transaction copies the value from the latest earlier record of the same key in the
  stream that has one (the old key's record, for an update that changed the key). The value is
  found with a backward scan over the not yet compacted tail of the stream, and through the
  compaction key map (``changelog_keys``) below it, then in the snapshot segments after that
  record (``_snapshot_segments``); columns are matched by name, so records of older schema versions
  serve as sources too.

Within one store transaction the fills run in position order, so a chain of such updates of
one key in one batch fills each record from the previous one.

If no earlier record of the key holds the value, the value at that point of the stream is not
known anywhere: the row's snapshot read is still to come (a snapshot resumed after a crash
reads the rest of the table in-band, after changes made meanwhile), the row moved there from a
key that was never read, or the capture started without an initial snapshot. Such a record is
then left out (never a NULL or a placeholder in its place) and the row is queued in
``lakefold.capture_rereads``: the capture reads it again with the incremental snapshot's
locked, in-band read (``_reread``), so a ``read`` record with the complete row follows later in
the stream, consistent at its own point. Until then the row's previous state stands; a row
deleted meanwhile gets no read.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from lakefold.store.internals import snapshot_segments, split_key

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")
_ARRAY = struct.Struct(">iiiiii")  # field length, ndim, flags, element oid, dim, lbound
_NULL: Final = b"\xff\xff\xff\xff"

_SOURCE: Final = """
SELECT position, schema_version FROM (
    (SELECT position, schema_version FROM lakefold.changelog
     WHERE stream_id = %(s)s AND position < %(p)s AND position > %(floor)s AND key = %(k)s
       AND after IS NOT NULL
     ORDER BY position DESC LIMIT 1)
    UNION ALL
    (SELECT c.position, c.schema_version FROM lakefold.changelog_keys m
     JOIN lakefold.changelog c ON c.stream_id = m.stream_id AND c.position = m.position
     WHERE m.stream_id = %(s)s AND m.key = %(k)s AND c.position < %(p)s
       AND c.after IS NOT NULL)
) x ORDER BY position DESC LIMIT 1
"""


def array_parts(field_bytes: bytes) -> list[bytes]:
    """The elements of a binary-COPY ``text[]`` field (with its leading length), each still
    encoded as ``int32 length + bytes`` (or the 4-byte NULL marker)."""
    _length, ndim, _flags, _oid, count, _lbound = _ARRAY.unpack_from(field_bytes, 0)
    if ndim == 0:
        return []
    parts = []
    offset = _ARRAY.size
    for _ in range(count):
        (length,) = _I32.unpack_from(field_bytes, offset)
        end = offset + 4 + max(length, 0)
        parts.append(field_bytes[offset:end])
        offset = end
    return parts


def array_field(parts: list[bytes]) -> bytes:
    """The inverse of ``array_parts``."""
    body = b"".join(parts)
    return _ARRAY.pack(20 + len(body), 1, 0, 25, len(parts), 1) + body


def fill_from_before(before: bytes, after: bytes, indexes: list[int]) -> bytes:
    """The new image ``after`` with the values at ``indexes`` taken from the full old image
    ``before`` (REPLICA IDENTITY FULL)."""
    old = array_parts(before)
    new = array_parts(after)
    for i in indexes:
        if i < len(old) and i < len(new):
            new[i] = old[i]
    return array_field(new)


@dataclass(frozen=True, slots=True)
class FillItem:
    """Record ``position`` of stream ``stream_id`` lacks the values of ``columns`` (their
    0-based ``indexes`` in its schema version); take them from the latest earlier record of
    ``source_key`` (the key bytes as stored)."""

    stream_id: int
    position: int
    source_key: bytes
    indexes: tuple[int, ...]
    columns: tuple[str, ...]


@dataclass
class ToastFill:
    """A store action (run inside the batch's transaction, after its records are written)
    that fills unchanged TOASTed values of the capture of ``slot``; see the module
    docstring."""

    slot: str
    items: list[FillItem] = field(default_factory=list)

    def __call__(self, cur: psycopg.Cursor[Any]) -> None:
        floors: dict[int, int] = {}
        names: dict[tuple[int, int], list[str]] = {}
        for item in sorted(self.items, key=lambda i: (i.stream_id, i.position)):
            if item.stream_id not in floors:
                snapshot_segments.hold(cur, item.stream_id)
                row = cur.execute(
                    "SELECT compacted_to FROM lakefold.changelog_compaction WHERE stream_id = %s",
                    (item.stream_id,)).fetchone()
                floors[item.stream_id] = int(row[0]) if row else 0
            found = cur.execute(_SOURCE, {"s": item.stream_id, "p": item.position,
                                          "k": item.source_key,
                                          "floor": floors[item.stream_id]}).fetchone()
            key = [None if v is None else v.decode() for v in split_key(item.source_key)]
            in_segment = snapshot_segments.latest_with_key(
                cur, item.stream_id, key, above=int(found[0]) if found else 0,
                below=item.position)
            if found is None and in_segment is None:
                self._reread_instead(cur, item)
                continue
            version = in_segment[1] if in_segment else int(found[1]) if found else 0
            if (item.stream_id, version) not in names:
                names[(item.stream_id, version)] = _column_names(cur, item.stream_id, version)
            source_names = names[(item.stream_id, version)]
            pairs = [(i, source_names.index(n)) for i, n in zip(item.indexes, item.columns,
                                                                strict=True)
                     if n in source_names]
            if not pairs:
                continue
            if in_segment is not None:
                cur.execute(sql.SQL(
                    "UPDATE lakefold.changelog SET {} WHERE stream_id = %s AND position = %s"
                ).format(sql.SQL(", ").join(
                    sql.SQL("after[{}] = %s").format(sql.Literal(i + 1)) for i, _ in pairs)),
                    [*(in_segment[2][j] for _, j in pairs), item.stream_id, item.position])
            elif found is not None:
                assignments = sql.SQL(", ").join(
                    sql.SQL("after[{}] = s.after[{}]").format(sql.Literal(i + 1),
                                                              sql.Literal(j + 1))
                    for i, j in pairs)
                cur.execute(sql.SQL(
                    "UPDATE lakefold.changelog c SET {} FROM lakefold.changelog s "
                    "WHERE c.stream_id = %(s)s AND c.position = %(p)s AND s.stream_id = %(s)s "
                    "AND s.position = %(src)s").format(assignments),
                    {"s": item.stream_id, "p": item.position, "src": int(found[0])})


    def _reread_instead(self, cur: psycopg.Cursor[Any], item: FillItem) -> None:
        """Leave the record out and queue its row to be read again (module docstring)."""
        cur.execute(
            "WITH gone AS (DELETE FROM lakefold.changelog WHERE stream_id = %(s)s "
            "AND position = %(p)s RETURNING key, schema_version), "
            "uncounted AS (UPDATE lakefold.capture_slots SET records = records - 1 "
            "WHERE slot_name = %(slot)s AND EXISTS (SELECT FROM gone)) "
            "INSERT INTO lakefold.capture_rereads (slot_name, stream_id, key, schema_version) "
            "SELECT %(slot)s, %(s)s, key, schema_version FROM gone "
            "ON CONFLICT (slot_name, stream_id, key) DO UPDATE "
            "SET schema_version = EXCLUDED.schema_version, requested_at = now()",
            {"s": item.stream_id, "p": item.position, "slot": self.slot})
        log.info("stream %d position %d: no earlier record of the key holds the unchanged "
                 "TOASTed value(s) of %s; the row will be read again instead", item.stream_id,
                 item.position, ", ".join(item.columns))


def _column_names(cur: psycopg.Cursor[Any], stream_id: int, version: int) -> list[str]:
    row = cur.execute(
        "SELECT columns FROM lakefold.changelog_schemas WHERE stream_id = %s AND version = %s",
        (stream_id, version)).fetchone()
    if row is None:
        return []
    items = row[0]
    return [str(c["name"]) for c in items]
