"""The PostgreSQL read paths: one stream by version, the global log by position.

Global reads see only sequenced events (rows of ``lakefold.event_positions``), so they never
skip an event that commits late (see ``_sequencer.py``). Unfiltered reads take a run of
positions and the matching range of the events' primary key (positions follow ``(xid, seq)``
order); category and type reads walk their index and look each event up, so their cost
follows what they return. Envelopes are built by psycopg row factories, straight from the
driver's values, and payloads stay JSON text until ``EventEnvelope.data`` is used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from lakefold.eventstore._model import LogQuery, StreamQuery
from lakefold.eventstore._sequencer import sequence_once
from lakefold.schemas.events import (
    EMPTY_METADATA,
    STREAM_DELETED_TYPE,
    EventEnvelope,
    EventMetadata,
)

Conn = psycopg.Connection[TupleRow]

# Empty metadata comes back as NULL: nothing to decode for most events.
_READ_STREAM: Final = sql.SQL(
    "SELECT p.position, e.event_id, e.stream_id, e.stream_version, e.type, e.schema_version, "
    "e.data::text, NULLIF(e.metadata, '{{}}'::jsonb), e.correlation_id, e.causation_id, "
    "e.recorded_at "
    "FROM lakefold.events e "
    "LEFT JOIN lakefold.event_positions p ON p.xid = e.xid AND p.seq = e.seq "
    "WHERE e.stream_id = %(stream)s AND {version} {deleted} "
    "ORDER BY e.stream_version {direction} LIMIT %(limit)s"
)
# Positions first (an index range scan over what is read), then one primary-key lookup per
# position (LATERAL forces that plan: a hash join would scan the whole events table). Hidden
# and erased events come back as rows of NULLs, so a page's length still says whether the
# positions ran out.
_READ_LOG: Final = sql.SQL(
    "SELECT p.position, e.event_id, e.stream_id, e.stream_version, e.type, e.schema_version, "
    "e.data::text, NULLIF(e.metadata, '{{}}'::jsonb), e.correlation_id, e.causation_id, "
    "e.recorded_at "
    "FROM ({positions}) AS p "
    "LEFT JOIN LATERAL (SELECT * FROM lakefold.events e "
    "  WHERE e.xid = p.xid AND e.seq = p.seq {deleted}) AS e ON true "
    "ORDER BY p.position"
)
_POSITIONS: Final = sql.SQL(
    "SELECT position, xid, seq FROM lakefold.event_positions "
    "WHERE position >= %(from)s AND position < %(to)s "
    "ORDER BY position LIMIT %(limit)s"
)
_POSITIONS_CATEGORY: Final = sql.SQL(
    "SELECT position, xid, seq FROM lakefold.event_positions "
    "WHERE category = %(category)s AND position >= %(from)s AND position < %(to)s "
    "ORDER BY position LIMIT %(limit)s"
)
_POSITIONS_CATEGORY_TYPES: Final = sql.SQL(
    "SELECT position, xid, seq FROM lakefold.event_positions "
    "WHERE category = %(category)s AND position >= %(from)s AND position < %(to)s "
    "AND type = ANY(%(types)s::text[]) ORDER BY position LIMIT %(limit)s"
)
# One ordered index scan per type, merged: cost follows the events read, not the store.
_POSITIONS_TYPES: Final = sql.SQL(
    "SELECT q.position, q.xid, q.seq FROM unnest(%(types)s::text[]) AS t(type) "
    "CROSS JOIN LATERAL (SELECT position, xid, seq FROM lakefold.event_positions "
    "  WHERE type = t.type AND position >= %(from)s AND position < %(to)s "
    "  ORDER BY position LIMIT %(limit)s) AS q "
    "ORDER BY q.position LIMIT %(limit)s"
)
_NO_END: Final = 2**63 - 1


# Row factories build envelopes straight from the driver's values: reads make one object per
# event, not three.

def _envelope_rows(cursor: Any) -> Callable[[Sequence[Any]], EventEnvelope | int]:
    """Rows ``(position, event_id, stream_id, stream_version, type, schema_version, data,
    metadata or NULL, correlation_id, causation_id, recorded_at)``; a NULL event id (an erased
    or hidden event) becomes its bare position."""

    def make(v: Sequence[Any]) -> EventEnvelope | int:
        if v[1] is None:
            return int(v[0])
        metadata = EMPTY_METADATA if v[7] is None and v[8] is None and v[9] is None \
            else EventMetadata(v[8], v[9], v[7] or {})
        return EventEnvelope(v[1], v[2], v[3], v[0], v[4], v[5], v[6], metadata, v[10])

    return make


def _range_rows(positions: list[int], include_deleted: bool
                ) -> Callable[[Any], Callable[[Sequence[Any]], EventEnvelope | int]]:
    """Rows of ``_RANGE_EVENTS`` paired, in order, with ``positions``."""
    next_position = iter(positions).__next__

    def factory(cursor: Any) -> Callable[[Sequence[Any]], EventEnvelope | int]:
        def make(v: Sequence[Any]) -> EventEnvelope | int:
            position = next_position()
            if v[10] and not include_deleted:
                return position
            metadata = EMPTY_METADATA if v[6] is None and v[7] is None and v[8] is None \
                else EventMetadata(v[7], v[8], v[6] or {})
            return EventEnvelope(v[0], v[1], v[2], position, v[3], v[4], v[5], metadata, v[9])

        return make

    return factory


def read_stream_on(conn: Conn, stream_id: str, query: StreamQuery) -> list[EventEnvelope]:
    """Read one stream on ``conn`` (see ``StreamQuery``)."""
    if query.backwards:
        version = sql.SQL("e.stream_version <= %(version)s")
        start = _NO_END if query.from_version is None else query.from_version
    else:
        version = sql.SQL("e.stream_version >= %(version)s")
        start = 0 if query.from_version is None else query.from_version
    statement = _READ_STREAM.format(
        version=version,
        deleted=sql.SQL("") if query.include_deleted else sql.SQL("AND NOT e.deleted"),
        direction=sql.SQL("DESC" if query.backwards else "ASC"),
    )
    params = {"stream": stream_id, "version": start,
              "limit": _NO_END if query.limit is None else query.limit}
    with conn.cursor(row_factory=_envelope_rows) as cursor:
        rows = cursor.execute(statement, params, prepare=True, binary=True).fetchall()
    return [row for row in rows if isinstance(row, EventEnvelope)]


_RANGE_POSITIONS: Final = (
    "SELECT position FROM lakefold.event_positions "
    "WHERE position >= %s AND position < %s ORDER BY position LIMIT %s"
)
# Positions follow (xid, seq) order, so the events of a run of positions are one range of the
# events' primary key: a single index range scan, no per-event lookup.
_RANGE_EVENTS: Final = (
    "SELECT e.event_id, e.stream_id, e.stream_version, e.type, e.schema_version, "
    "e.data::text, NULLIF(e.metadata, '{}'::jsonb), e.correlation_id, e.causation_id, "
    "e.recorded_at, e.deleted "
    "FROM lakefold.events e "
    "WHERE (e.xid, e.seq) >= (SELECT p.xid, p.seq FROM lakefold.event_positions p "
    "                         WHERE p.position = %s) "
    "  AND (e.xid, e.seq) <= (SELECT p.xid, p.seq FROM lakefold.event_positions p "
    "                         WHERE p.position = %s) "
    "ORDER BY e.xid, e.seq"
)


def _read_range(conn: Conn, start: int, end: int, want: int, include_deleted: bool,
                statement: sql.Composed) -> list[EventEnvelope | int]:
    """Envelopes (or the bare positions of hidden and erased events) for up to ``want``
    positions from ``start``."""
    positions = [row[0] for row in conn.execute(
        _RANGE_POSITIONS, (start, end, want), prepare=True, binary=True).fetchall()]
    if not positions:
        return []
    with conn.cursor(row_factory=_range_rows(positions, include_deleted)) as cursor:
        try:
            rows = cursor.execute(_RANGE_EVENTS, (positions[0], positions[-1]),
                                  prepare=True, binary=True).fetchall()
        except StopIteration:  # more events than positions: see below
            rows = []
    if len(rows) == len(positions):
        return rows
    # A position whose event is gone (cannot happen while hard deletes keep sequencers out,
    # but cheap to survive): fall back to one lookup per position.
    with conn.cursor(row_factory=_envelope_rows) as cursor:
        return cursor.execute(statement, {"from": start, "to": end, "limit": want},
                              prepare=True, binary=True).fetchall()


def read_log_on(conn: Conn, query: LogQuery) -> list[EventEnvelope]:
    """Read the global log on ``conn`` (see ``LogQuery``): fetch pages of positions until
    ``limit`` visible events are collected or the head (after one sequencing round) or
    ``to_position`` is reached."""
    types = None if query.types is None else [*query.types, STREAM_DELETED_TYPE]
    if types is None:
        positions = _POSITIONS if query.category is None else _POSITIONS_CATEGORY
    else:
        positions = _POSITIONS_TYPES if query.category is None else _POSITIONS_CATEGORY_TYPES
    statement = _READ_LOG.format(
        positions=positions,
        deleted=sql.SQL("") if query.include_deleted else sql.SQL("AND NOT e.deleted"))
    unfiltered = types is None and query.category is None
    end = _NO_END if query.to_position is None else query.to_position
    cursor = max(query.from_position, 1)
    found: list[EventEnvelope] = []
    sequenced = False
    while cursor < end:
        want = query.limit - len(found)
        if unfiltered:
            rows = _read_range(conn, cursor, end, want, query.include_deleted, statement)
        else:
            with conn.cursor(row_factory=_envelope_rows) as reader:
                rows = reader.execute(
                    statement,
                    {"from": cursor, "to": end, "limit": want, "category": query.category,
                     "types": types},
                    prepare=True, binary=True,
                ).fetchall()
        found.extend(row for row in rows if isinstance(row, EventEnvelope))
        if rows:
            last = rows[-1]
            cursor = (last if isinstance(last, int) else last.position or cursor) + 1
        if len(found) >= query.limit:
            break
        if len(rows) < want:  # reached the head as last sequenced
            if sequenced:
                break
            head = sequence_once(conn).head
            sequenced = True
            if head < cursor:
                break
    return found
