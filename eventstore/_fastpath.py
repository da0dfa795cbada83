"""Single-stream appends in one plain SQL statement.

Most appends are an aggregate's: a few events to one stream with an exact expected version.
For those, outside a caller's transaction, one ``WITH ... INSERT`` statement checks and bumps
the stream's row and inserts the events: no PL/pgSQL, no parameter arrays for one event, about
a third of the server time of ``lakefold.append_events``. Ordinals start at 0 because the
statement is its own transaction. When the check fails the statement writes nothing and
returns no row; the caller then goes through ``append_events``, which raises the precise error
(or, for an idempotent retry, finds the original events).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from lakefold.eventstore._copy import expected_code
from lakefold.eventstore._model import StreamAppend

# The stream-row step for each kind of expected version; each yields the version before.
_STREAM_STEP: Final = {
    "exact": sql.SQL(
        "UPDATE lakefold.streams SET version = version + %(n)s, updated_at = now() "
        "WHERE stream_id = %(stream)s AND version = %(expected)s AND deleted IS NULL "
        "RETURNING version - %(n)s AS prev"),
    "exists": sql.SQL(
        "UPDATE lakefold.streams SET version = version + %(n)s, updated_at = now() "
        "WHERE stream_id = %(stream)s AND deleted IS NULL "
        "RETURNING version - %(n)s AS prev"),
    "any": sql.SQL(
        "INSERT INTO lakefold.streams AS st (stream_id, category, version) "
        "VALUES (%(stream)s, %(category)s, %(n)s) ON CONFLICT (stream_id) DO UPDATE "
        "SET version = st.version + %(n)s, updated_at = now() WHERE st.deleted IS NULL "
        "RETURNING st.version - %(n)s AS prev"),
    "new": sql.SQL(
        "INSERT INTO lakefold.streams (stream_id, category, version) "
        "VALUES (%(stream)s, %(category)s, %(n)s) ON CONFLICT (stream_id) DO NOTHING "
        "RETURNING 0::bigint AS prev"),
}
_INSERT: Final = sql.SQL(
    "INSERT INTO lakefold.events (ordinal, event_id, stream_id, stream_version, category, "
    "type, schema_version, data, metadata, correlation_id, causation_id) "
)
_ONE: Final = sql.SQL(
    "WITH s AS ({step}), i AS ({insert}"
    "SELECT 0, %(id)s::uuid, %(stream)s::text, s.prev + 1, %(category)s::text, "
    "%(type)s::text, %(version)s::integer, %(data)s::json, "
    "COALESCE(%(metadata)s::jsonb, '{{}}'::jsonb), %(correlation)s::uuid, %(causation)s::uuid "
    "FROM s) SELECT prev FROM s"
)
_MANY: Final = sql.SQL(
    "WITH s AS ({step}), i AS ({insert}"
    "SELECT x.o - 1, x.i, %(stream)s::text, s.prev + x.o, %(category)s::text, x.t, x.v, "
    "x.d::json, COALESCE(x.m::jsonb, '{{}}'::jsonb), x.c, x.z "
    "FROM s, unnest(%(ids)b::uuid[], %(types)b::text[], %(versions)b::integer[], "
    "%(data)b::text[], %(metadata)b::text[], %(correlation)b::uuid[], %(causation)b::uuid[]) "
    "WITH ORDINALITY AS x(i, t, v, d, m, c, z, o)) SELECT prev FROM s"
)
# Rendered to text once: psycopg renders a Composed query again on every execute (tens of µs,
# a large share of a one-event append), but parses a str query once and caches the result.
_STATEMENTS: Final = {
    (kind, many): (_MANY if many else _ONE).format(step=step, insert=_INSERT).as_string()
    for kind, step in _STREAM_STEP.items() for many in (False, True)
}


# The stream step for each SQL code of an expected version (``expected_code``); any other
# code is an exact version.
_KIND_OF_CODE: Final = {None: "any", -1: "new", -2: "exists"}


def fast_append(conn: psycopg.Connection[TupleRow], append: StreamAppend) -> int | None:
    """Append one stream's events on an autocommit ``conn``; the stream's version before the
    append, or None when the expected version (or deletion state) did not allow it and
    nothing was written."""
    params: dict[str, Any] = {
        "stream": append.stream_id, "category": append.category, "n": len(append.events),
        "expected": append.expected_version if isinstance(append.expected_version, int)
        else None,
    }
    events = append.events
    many = len(events) > 1
    if many:
        params.update(
            ids=[e.event.event_id for e in events], types=[e.event.type for e in events],
            versions=[e.event.schema_version for e in events],
            data=[e.data_json for e in events],
            metadata=[None if e.metadata_json == "{}" else e.metadata_json for e in events],
            correlation=[e.event.metadata.correlation_id for e in events],
            causation=[e.event.metadata.causation_id for e in events])
    else:
        encoded = events[0]
        event = encoded.event
        params.update(
            id=event.event_id, type=event.type, version=event.schema_version,
            data=encoded.data_json,
            metadata=None if encoded.metadata_json == "{}" else encoded.metadata_json,
            correlation=event.metadata.correlation_id, causation=event.metadata.causation_id)
    kind = _KIND_OF_CODE.get(expected_code(append.expected_version), "exact")
    statement = _STATEMENTS[(kind, many)]
    row = conn.execute(statement, params, prepare=True).fetchone()
    return None if row is None else int(row[0])
