"""Large appends by COPY: the client streams rows while the server inserts them.

``append_events`` takes the whole append as one statement, so the client builds every row
before the server starts and the server parses every row before it inserts: the two work in
turn. For appends of ``COPY_THRESHOLD`` events or more, ``copy_append`` instead reserves the
stream versions and the transaction's ordinals (``lakefold.reserve_versions`` and
``lakefold.take_ordinals``, with the same checks and errors as ``append_events``) and then
streams the rows with binary ``COPY``, so client and server work at the same time, on the two
cores of a small machine. It must run inside a transaction: a failure anywhere rolls the whole
append back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from lakefold.eventstore._model import Expected, ExpectedVersion, StreamAppend

#: Appends of at least this many events go through COPY.
COPY_THRESHOLD: Final = 200

_RESERVE: Final = (
    "SELECT lakefold.reserve_versions(%b::text[], %b::text[], %b::bigint[], %b::integer[]), "
    "lakefold.take_ordinals(%b::integer)"
)
_COPY: Final = (
    "COPY lakefold.events (ordinal, event_id, stream_id, stream_version, category, type, "
    "schema_version, data, metadata, correlation_id, causation_id) FROM STDIN (FORMAT BINARY)"
)
# Binary COPY has no per-field types: each field is read by its column's receive function.
# json's binary form is its text, and jsonb's is a version byte (1) and its text, so the
# payloads already encoded as JSON go out as "text" and "bytea" without being re-encoded.
_TYPES: Final = ["int4", "uuid", "text", "int8", "text", "text", "int4", "text", "bytea",
                 "uuid", "uuid"]
_EMPTY_JSONB: Final = b"\x01{}"


def expected_code(expected: ExpectedVersion) -> int | None:
    """The SQL encoding of an expected version: NULL any, -1 no stream, -2 stream exists."""
    if expected is Expected.ANY:
        return None
    if expected is Expected.NO_STREAM:
        return -1
    if expected is Expected.STREAM_EXISTS:
        return -2
    return expected


def copy_append(conn: psycopg.Connection[TupleRow], appends: Sequence[StreamAppend]
                ) -> list[int]:
    """Append by COPY on ``conn``, which must be inside a transaction; returns each stream's
    version before the append. Raises the same psycopg errors as ``append_events``."""
    total = sum(len(a.events) for a in appends)
    row = conn.execute(_RESERVE, (
        [a.stream_id for a in appends], [a.category for a in appends],
        [expected_code(a.expected_version) for a in appends], [len(a.events) for a in appends],
        total,
    )).fetchone()
    if row is None:  # pragma: no cover - a SELECT of two functions returns one row
        raise psycopg.DataError("reserving versions returned no row")
    prev_versions: list[int] = row[0]
    ordinal: int = row[1]
    with conn.cursor().copy(_COPY) as copy:
        copy.set_types(_TYPES)
        write = copy.write_row
        for append, prev in zip(appends, prev_versions, strict=True):
            stream_id, category, version = append.stream_id, append.category, prev
            for encoded in append.events:
                event = encoded.event
                meta = event.metadata
                version += 1
                metadata = _EMPTY_JSONB if encoded.metadata_json == "{}" else (
                    b"\x01" + encoded.metadata_json.encode())
                write((ordinal, event.event_id, stream_id, version, category, event.type,
                       event.schema_version, encoded.data_json, metadata, meta.correlation_id,
                       meta.causation_id))
                ordinal += 1
    return prev_versions
