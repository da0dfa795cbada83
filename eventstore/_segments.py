"""Sealed segments: complete ranges of the global log stored columnar, for bulk readers.

Why. A full replay reads every event. Read as rows, the server formats a dozen values per event
(about 1.1 µs of server CPU for the twelve columns, more than the rest of a Spark read), and a
replay pays that on every rebuild of every projection. Events never change once final, so each
complete range of positions is *sealed* once into one row of ``lakefold.event_segments``: the
range's visible events as one Arrow IPC file, zstd-compressed (about 32 bytes per event). A bulk
read of a sealed range is then a few megabytes of ``bytea`` for the server to send and a
column-selective decompression for the reader (~15M events/s on one core).

What a segment holds. ``first_position <= position < end_position``: exactly the rows the log
read (``events_range_select``, soft-deleted events hidden) returns for that range, in position
order, as ``EVENTS_ARROW_SCHEMA``. Ranges are ``SEGMENT_POSITIONS`` long and aligned to
multiples of it (the first covers positions 1..65,536), and lie at or below the head, so their
positions are final. Segments never overlap.

Shredded payloads. A segment also holds its payloads' top-level scalar fields parsed, as a
struct column ``data_fields`` (``PAYLOAD_FIELDS``): each field whose values are all of one JSON
type (integer, number, boolean or string; null allowed), typed as Arrow's JSON reader infers
it (int64, float64, bool, string). Nested values stay in the text only, and when a field holds
different types (a number here, a string there) the segment has no such column. A typed reader
(the Spark source with a registry) takes a field from there when it would parse the same type
from the text anyway, and skips parsing the payloads (0.2 µs an event on one core).

Deletion. ``lakefold.delete_stream`` drops, in its own transaction, every segment holding a
visible event of the stream; the sealer later seals the range again without it. Erased
events therefore leave no copy behind, and hidden ones are never read from a segment. Sealers
and deletions meet on one advisory lock (``SEAL_LOCK_KEY``): a deletion takes it shared for its
whole transaction, a sealer exclusive (try only: a sealer never waits for a deletion) while it
reads the range and inserts the segment. So a sealer never reads a range while a deletion is
under way, and a deletion that starts later sees the new segment (it runs READ COMMITTED,
which the function checks) and drops it.

Who seals (``_sealer.py``). Each ``EventStore`` runs a background sealer (on by default,
``StoreOptions.seal_segments``) that seals the ranges its sequencing rounds complete, after
deletions and after a store is first opened. ``seal(dsn)`` (``EventStore.seal()``,
``lakefold events seal``) seals whatever is missing at once, e.g. after upgrading a store.
Readers never wait for sealing: a range without a segment is read as rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import numpy as np
import pyarrow as pa
from psycopg import sql

from lakefold.schemas.json_payloads import parse_payloads

#: Positions per segment (and their alignment).
SEGMENT_POSITIONS: Final = 65_536

#: The struct column of a segment's shredded payload fields.
PAYLOAD_FIELDS: Final = "data_fields"
_SHREDDABLE: Final = (pa.int64(), pa.float64(), pa.bool_(), pa.string())
_WRITE_OPTIONS: Final = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 1))
_READ_ALL: Final = pa.ipc.IpcReadOptions(use_threads=False)  # Spark runs a task per core
BOUNDS: Final = "SELECT first_position, end_position FROM lakefold.event_segments "


def shred(texts: pa.ChunkedArray) -> pa.StructArray | None:
    """The payloads' top-level scalar fields, typed (see the module docstring); None when
    there are none, or when the payloads do not parse as one table."""
    if len(texts) == 0:
        return None
    try:
        parsed = parse_payloads(texts.combine_chunks(), None)
    except pa.ArrowInvalid:
        return None
    scalars = [field for field in parsed.schema if field.type in _SHREDDABLE]
    if not scalars:
        return None
    return pa.StructArray.from_arrays(
        [parsed.column(field.name).combine_chunks() for field in scalars], fields=scalars)


def encode(table: pa.Table) -> bytes:
    """``table`` (``EVENTS_ARROW_SCHEMA``), with its shredded payload fields, as one
    compressed Arrow IPC file."""
    fields = shred(table.column("data"))
    if fields is not None:
        table = table.append_column(PAYLOAD_FIELDS, fields)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def decode(data: pa.Buffer, columns: list[str] | None = None) -> pa.Table:
    """A segment's events; with ``columns``, only those are decompressed (in the file's
    column order; ``PAYLOAD_FIELDS`` only where the segment has it)."""
    if columns is None:
        return pa.ipc.open_file(data, options=_READ_ALL).read_all()
    names = pa.ipc.open_file(data).schema.names  # the footer only
    wanted = set(columns)
    options = pa.ipc.IpcReadOptions(use_threads=False, included_fields=[
        i for i, name in enumerate(names) if name in wanted])
    return pa.ipc.open_file(data, options=options).read_all()


def slice_positions(table: pa.Table, start: int, end: int) -> pa.Table:
    """The rows of a position-ordered ``table`` with ``start <= position < end``."""
    positions = table.column("position").to_numpy()
    lo, hi = np.searchsorted(positions, [start, end])
    return table.slice(int(lo), int(hi - lo))


def bounds_statement(start: int, end: int) -> str:
    """The ``(first_position, end_position)`` of the segments overlapping ``[start, end)``, in
    order (the segment holding ``start`` is found by one probe of the primary key)."""
    return sql.SQL(
        BOUNDS + "WHERE first_position >= coalesce((SELECT max(first_position) "
        "FROM lakefold.event_segments WHERE first_position <= {start}), 0) "
        "AND first_position < {end} AND end_position > {start} ORDER BY first_position"
    ).format(start=sql.Literal(start), end=sql.Literal(end)).as_string(None)


def data_statement(first: int, last: int) -> str:
    """The data of the segments whose first positions are ``first..last``, in order."""
    return sql.SQL(
        "SELECT data FROM lakefold.event_segments WHERE first_position >= {first} "
        "AND first_position <= {last} ORDER BY first_position"
    ).format(first=sql.Literal(first), last=sql.Literal(last)).as_string(None)


def segment_data(batch: pa.RecordBatch) -> Iterator[pa.Buffer]:
    """The segment files in a batch of ``data_statement``, without copying them."""
    column = batch.column(0)
    for i in range(len(column)):
        yield column[i].as_buffer()


def unsealed_ranges(bounds: list[tuple[int, int]], head: int,
                    size: int = SEGMENT_POSITIONS) -> list[tuple[int, int]]:
    """The ranges a sealer should seal, in order: each aligned block of ``size`` positions at
    or below ``head``, minus the existing segments (``bounds``, sorted), cut at those
    segments' edges. A block's rest above the head is left for later."""
    out: list[tuple[int, int]] = []
    limit = head // size * size + 1  # the end of the last complete block
    position = 1
    for first, end in [*bounds, (limit, limit)]:
        gap_end = min(first, limit)
        while position < gap_end:
            block_end = ((position - 1) // size + 1) * size + 1
            piece_end = min(block_end, gap_end)
            out.append((position, piece_end))
            position = piece_end
        position = max(position, end)
    return out
