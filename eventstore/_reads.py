"""The PostgreSQL read paths: one stream by version, the global log by position.

An event's global position is ``first_position`` of its transaction's row in
``lakefold.event_positions`` plus its ``ordinal``, and positions follow ``(xid, ordinal)``
order. So a position range is a key range of the events' primary key: a read turns its bounds
into ``(xid, ordinal)`` keys (one index probe each) and walks an index from there. Unfiltered
reads walk the primary key; category and type reads walk ``events_category_idx`` /
``events_type_idx``; their cost follows what they return. Global reads stop at the sequencer's
cursor, so they never see an event that is not final (see ``_sequencer.py``).

Envelopes are built by psycopg row factories, straight from the driver's values, and payloads
stay JSON text until ``EventEnvelope.data`` is used.
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

_NO_END: Final = 2**63 - 1

#: What envelope rows select (empty metadata comes back as NULL: nothing to decode).
ENVELOPE_COLUMNS: Final = sql.SQL(
    "b.first_position + e.ordinal, e.event_id, e.stream_id, e.stream_version, e.type, "
    "e.schema_version, e.data::text, NULLIF(e.metadata, '{}'::jsonb), e.correlation_id, "
    "e.causation_id, e.recorded_at"
)

_READ_STREAM: Final = sql.SQL(
    "SELECT {columns} FROM lakefold.events e "
    "LEFT JOIN lakefold.event_positions b ON b.xid = e.xid "
    "WHERE e.stream_id = %(stream)s AND {version} {deleted} "
    "ORDER BY e.stream_version {direction} LIMIT %(limit)s"
)


# Each event's run of positions, by one lookup on the transaction's unique key. LATERAL with
# LIMIT (which keeps the planner from flattening it) fixes that plan: a hash join would read
# all of event_positions, one row per transaction ever.
_POSITION_OF: Final = sql.SQL(
    "CROSS JOIN LATERAL (SELECT first_position FROM lakefold.event_positions p "
    "WHERE p.xid = e.xid LIMIT 1) AS b"
)


def _key(param: str) -> sql.Composed:
    """The ``(xid, ordinal)`` key of the position in parameter ``param``: the transaction
    whose run of positions holds it, and the offset into that run."""
    return sql.SQL(
        "(SELECT z.xid, z.ordinal FROM ("
        " SELECT xid, {p} - first_position AS ordinal, first_position"
        " FROM lakefold.event_positions WHERE first_position <= {p}"
        " UNION ALL SELECT '0'::xid8, 0, 0) AS z"
        " ORDER BY z.first_position DESC LIMIT 1)"
    ).format(p=sql.Placeholder(param))


def log_statement(columns: sql.Composable, *, category: bool, types: bool,
                  include_deleted: bool, bounded: bool) -> sql.Composed:
    """A read of the global log from position ``%(from)s`` (inclusive) to ``%(to)s``
    (exclusive, when ``bounded``), at most ``%(limit)s`` rows in position order, optionally
    for ``%(category)s`` and/or the types in ``%(types)s``."""
    where: list[sql.Composable] = [
        sql.SQL("(e.xid, e.ordinal) >= ") + _key("from"),
        sql.SQL("e.xid <= (SELECT last_xid FROM lakefold.event_sequencer)"),
    ]
    if bounded:
        where.append(sql.SQL("(e.xid, e.ordinal) < ") + _key("to"))
    if category:
        where.append(sql.SQL("e.category = %(category)s"))
        if types:
            where.append(sql.SQL("e.type = ANY(%(types)s::text[])"))
    if not include_deleted:
        where.append(sql.SQL("NOT e.deleted"))
    conditions = sql.SQL(" AND ").join(where)
    if types and not category:
        # One ordered index scan per type, merged: cost follows the events read.
        return sql.SQL(
            "SELECT {columns} FROM unnest(%(types)s::text[]) AS t(type) "
            "CROSS JOIN LATERAL (SELECT * FROM lakefold.events e "
            "  WHERE e.type = t.type AND {conditions} "
            "  ORDER BY e.xid, e.ordinal LIMIT %(limit)s) AS e "
            "{positions} ORDER BY e.xid, e.ordinal LIMIT %(limit)s"
        ).format(columns=columns, conditions=conditions, positions=_POSITION_OF)
    return sql.SQL(
        "SELECT {columns} FROM lakefold.events e {positions} "
        "WHERE {conditions} ORDER BY e.xid, e.ordinal LIMIT %(limit)s"
    ).format(columns=columns, conditions=conditions, positions=_POSITION_OF)


def _envelope_rows(cursor: Any) -> Callable[[Sequence[Any]], EventEnvelope]:
    """Rows of ``ENVELOPE_COLUMNS`` as envelopes: one object per event, not three."""

    def make(v: Sequence[Any]) -> EventEnvelope:
        metadata = EMPTY_METADATA if v[7] is None and v[8] is None and v[9] is None \
            else EventMetadata(v[8], v[9], v[7] or {})
        return EventEnvelope(v[1], v[2], v[3], v[0], v[4], v[5], v[6], metadata, v[10])

    return make


def read_stream_on(conn: Conn, stream_id: str, query: StreamQuery) -> list[EventEnvelope]:
    """Read one stream on ``conn`` (see ``StreamQuery``)."""
    if query.backwards:
        version = sql.SQL("e.stream_version <= %(version)s")
        start = _NO_END if query.from_version is None else query.from_version
    else:
        version = sql.SQL("e.stream_version >= %(version)s")
        start = 0 if query.from_version is None else query.from_version
    statement = _READ_STREAM.format(
        columns=ENVELOPE_COLUMNS,
        version=version,
        deleted=sql.SQL("") if query.include_deleted else sql.SQL("AND NOT e.deleted"),
        direction=sql.SQL("DESC" if query.backwards else "ASC"),
    )
    params = {"stream": stream_id, "version": start,
              "limit": _NO_END if query.limit is None else query.limit}
    with conn.cursor(row_factory=_envelope_rows) as cursor:
        return cursor.execute(statement, params, prepare=True, binary=True).fetchall()


def read_log_on(conn: Conn, query: LogQuery) -> list[EventEnvelope]:
    """Read the global log on ``conn`` (see ``LogQuery``); when the first read comes up short,
    run one sequencing round and read on, so that ``head()``-fresh events are included."""
    types = None if query.types is None else [*query.types, STREAM_DELETED_TYPE]
    statement = log_statement(
        ENVELOPE_COLUMNS, category=query.category is not None, types=types is not None,
        include_deleted=query.include_deleted, bounded=query.to_position is not None)
    params: dict[str, Any] = {
        "from": max(query.from_position, 1), "to": query.to_position,
        "limit": query.limit, "category": query.category, "types": types}
    with conn.cursor(row_factory=_envelope_rows) as cursor:
        found = cursor.execute(statement, params, prepare=True, binary=True).fetchall()
        if len(found) < query.limit:
            last = found[-1].position if found else None
            head = sequence_once(conn).head
            if head >= (params["from"] if last is None else last + 1):
                params["from"] = params["from"] if last is None else last + 1
                params["limit"] = query.limit - len(found)
                found += cursor.execute(statement, params, prepare=True,
                                        binary=True).fetchall()
    return found
