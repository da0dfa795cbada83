"""The PostgreSQL read paths: one stream by version, the global log by position.

An event's global position is ``first_position`` of its transaction's row in
``lakefold.event_positions`` plus its ``ordinal``, and positions follow ``(xid, ordinal)``
order. Reads of the whole log take a *position range* ``[from, to)``: they walk
``event_positions`` from the run that holds ``from`` to ``to`` and read each transaction's
events by one range of the events' primary key, so the work is one index probe per
transaction plus the rows themselves, whatever the planner's statistics say (a page bounded
by a row LIMIT over an open key range let the planner pick a bitmap scan of everything after
``from`` plus a sort: every page cost the rest of the log). Category and type reads walk
the runs of ``lakefold.event_runs`` (by category or type, then transaction) from the
transaction of ``from``, at most a page's limit of them, and read each run's events by one
primary-key range; their cost follows what they return. Global reads see only sequenced
positions, so never an event that is not final (see ``_sequencer.py``).

Envelopes are built by psycopg row factories, straight from the driver's values, and payloads
stay JSON text until ``EventEnvelope.data`` is used.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from typing import Final

import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
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
_DECODER: Final = json.JSONDecoder()

#: What envelope rows select: ``EventEnvelope``'s fields in order, so a row *is* an envelope
#: (no per-row Python beyond the driver's loaders). Metadata arrives as ``json``: ``{}`` when
#: empty, else ``[correlation_id, causation_id, extra]``, turned into ``EventMetadata`` by
#: ``_MetadataLoader``; the payload is ``text``.
ENVELOPE_COLUMNS: Final = sql.SQL(
    "e.event_id, e.stream_id, e.stream_version, b.first_position + e.ordinal, e.type, "
    "e.schema_version, e.data::text, "
    "CASE WHEN e.correlation_id IS NULL AND e.causation_id IS NULL "
    "AND e.metadata = '{}'::jsonb THEN '{}'::json "
    "ELSE json_build_array(e.correlation_id, e.causation_id, e.metadata) END, "
    "e.recorded_at, NULL"
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
    # max() and min() are one probe of the primary key each; an ORDER BY over a UNION would
    # read (and sort) every transaction's row below the position, and NOT EXISTS over a
    # one-sided range may become a sequential scan under a generic plan.
    return sql.SQL(
        "(SELECT z.xid, z.ordinal FROM ("
        " SELECT xid, {p} - first_position AS ordinal FROM lakefold.event_positions"
        " WHERE first_position = (SELECT max(first_position) FROM lakefold.event_positions"
        "   WHERE first_position <= {p})"
        " UNION ALL SELECT '0'::xid8, 0 WHERE coalesce("
        "   (SELECT min(first_position) FROM lakefold.event_positions) > {p}, true)) AS z)"
    ).format(p=sql.Placeholder(param))


def _range_statement(columns: sql.Composable, *, include_deleted: bool) -> sql.Composed:
    # OFFSET 0 keeps the lateral subquery a per-transaction index range (never flattened into
    # a join over the whole events table).
    return sql.SQL(
        "SELECT {columns} FROM lakefold.event_positions b "
        "CROSS JOIN LATERAL (SELECT * FROM lakefold.events e WHERE e.xid = b.xid "
        "  AND e.ordinal >= %(from)s - b.first_position "
        "  AND e.ordinal < %(to)s - b.first_position {deleted} "
        "  ORDER BY e.ordinal OFFSET 0) AS e "
        "WHERE b.first_position >= (SELECT coalesce(max(r.first_position), 0) "
        "  FROM lakefold.event_positions r WHERE r.first_position <= %(from)s) "
        "  AND b.first_position < %(to)s "
        "ORDER BY b.first_position, e.ordinal LIMIT %(limit)s"
    ).format(columns=columns,
             deleted=sql.SQL("") if include_deleted else sql.SQL("AND NOT e.deleted"))


def log_statement(columns: sql.Composable, *, category: bool, types: bool,
                  include_deleted: bool, bounded: bool) -> sql.Composed:
    """A read of the global log from position ``%(from)s`` (inclusive) to ``%(to)s``
    (exclusive), at most ``%(limit)s`` rows in position order, optionally for
    ``%(category)s`` and/or the types in ``%(types)s``.

    Without a filter the read is a position range and ``%(to)s`` is always required (see
    ``page_end``): a short result then means holes or the head, not the end of the log.
    With a filter ``%(to)s`` is used only when ``bounded``."""
    if not category and not types:
        return _range_statement(columns, include_deleted=include_deleted)
    # At most ``limit`` runs that reach ``from`` (a run of its transaction may start before
    # it), in order, from the category or type index; every run holds at least one event
    # (see ``_ddl``), so they hold the page. Then each run's events, by one range of the
    # primary key.
    runs: list[sql.Composable] = [
        sql.SQL("r.xid >= (SELECT k.xid FROM ") + _key("from") + sql.SQL(" AS k)"),
        sql.SQL("(r.xid, r.last_ordinal) >= ") + _key("from"),
    ]
    events: list[sql.Composable] = [
        sql.SQL("e.xid = r.xid AND e.ordinal >= r.first_ordinal "
                "AND e.ordinal <= r.last_ordinal"),
        sql.SQL("(e.xid, e.ordinal) >= ") + _key("from"),
        sql.SQL("e.xid <= (SELECT last_xid FROM lakefold.event_sequencer)"),
    ]
    if bounded:
        runs.append(sql.SQL("(r.xid, r.first_ordinal) < ") + _key("to"))
        events.append(sql.SQL("(e.xid, e.ordinal) < ") + _key("to"))
    if category:
        runs.append(sql.SQL("r.category = %(category)s"))
    if types:
        runs.append(sql.SQL("r.type = ANY(%(types)s::text[])" if category else
                            "r.type = t.type"))
    if not include_deleted:
        runs.append(sql.SQL("NOT r.deleted"))
        events.append(sql.SQL("NOT e.deleted"))
    run_events = sql.SQL(
        "FROM (SELECT r.xid, r.first_ordinal, r.last_ordinal FROM lakefold.event_runs r "
        "  WHERE {runs} ORDER BY r.xid, r.first_ordinal LIMIT %(limit)s) AS r "
        "CROSS JOIN LATERAL (SELECT * FROM lakefold.events e WHERE {events} "
        "  ORDER BY e.ordinal OFFSET 0) AS e "
    ).format(runs=sql.SQL(" AND ").join(runs), events=sql.SQL(" AND ").join(events))
    order = sql.SQL("ORDER BY r.xid, r.first_ordinal, e.ordinal LIMIT %(limit)s")
    if types and not category:
        # One ordered walk of the type index per type, merged: cost follows the events read.
        return sql.SQL(
            "SELECT {columns} FROM unnest(%(types)s::text[]) AS t(type) "
            "CROSS JOIN LATERAL (SELECT e.* {run_events} {order}) AS e "
            "{positions} ORDER BY e.xid, e.ordinal LIMIT %(limit)s"
        ).format(columns=columns, run_events=run_events, order=order, positions=_POSITION_OF)
    return sql.SQL("SELECT {columns} {run_events} {positions} {order}").format(
        columns=columns, run_events=run_events, positions=_POSITION_OF, order=order)


def with_deletion_records(types: Sequence[str] | None) -> list[str] | None:
    """A type filter's types plus the deletion record (once: deletion records always pass a
    type filter), or None for no type filter."""
    return None if types is None else list(dict.fromkeys([*types, STREAM_DELETED_TYPE]))


def page_end(position: int, limit: int, end: int | None) -> int:
    """The ``%(to)s`` of an unfiltered page from ``position``: at most ``limit`` positions,
    never past ``end`` (exclusive; None: no end)."""
    return min(_NO_END if end is None else end, position + limit, _NO_END)


class _MetadataLoader(Loader):
    """``json`` values of ``ENVELOPE_COLUMNS`` as ``EventMetadata`` (json's binary form is its
    text)."""

    format = psycopg.pq.Format.BINARY

    def load(self, data: Buffer) -> EventMetadata:
        if data == b"{}":
            return EMPTY_METADATA
        correlation, causation, extra = _DECODER.decode(bytes(data).decode())
        return EventMetadata(None if correlation is None else uuid.UUID(correlation),
                             None if causation is None else uuid.UUID(causation), extra)


#: Rows of ``ENVELOPE_COLUMNS`` as envelopes, built by ``tuple.__new__`` itself.
_envelope_row: Final = functools.partial(tuple.__new__, EventEnvelope)


def _envelope_cursor(conn: Conn) -> psycopg.Cursor[EventEnvelope]:
    cursor = conn.cursor(row_factory=lambda _cursor: _envelope_row)
    cursor.adapters.register_loader("json", _MetadataLoader)
    return cursor


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
    with _envelope_cursor(conn) as cursor:
        return cursor.execute(statement, params, prepare=True, binary=True).fetchall()


def read_log_on(conn: Conn, query: LogQuery) -> list[EventEnvelope]:
    """Read the global log on ``conn`` (see ``LogQuery``). Unfiltered reads go page by page
    of positions until ``limit`` events, ``to_position`` or the head; when a read comes up
    short, one sequencing round runs first, so that ``head()``-fresh events are included."""
    types = with_deletion_records(query.types)
    unfiltered = query.category is None and types is None
    statement = log_statement(
        ENVELOPE_COLUMNS, category=query.category is not None, types=types is not None,
        include_deleted=query.include_deleted, bounded=query.to_position is not None)
    end = query.to_position
    position = max(query.from_position, 1)
    found: list[EventEnvelope] = []
    head: int | None = None
    with _envelope_cursor(conn) as cursor:
        while True:
            limit = query.limit - len(found)
            page_to = page_end(position, limit, end)
            rows = cursor.execute(statement, {
                "from": position, "to": page_to if unfiltered else end, "limit": limit,
                "category": query.category, "types": types}, prepare=True, binary=True).fetchall()
            found += rows
            if len(found) >= query.limit:
                return found
            if head is None:
                # Positions after the last row read may have been sequenced since: read on
                # from there, up to a head that covers everything committed before now.
                last = rows[-1].position if rows else None
                position = position if last is None else last + 1
                head = sequence_once(conn).head
            elif unfiltered:
                position = page_to  # every position below page_to was final: holes
            else:
                return found
            if (end is not None and position >= end) or position > head:
                return found
