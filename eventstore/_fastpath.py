"""Single-stream appends in one plain SQL statement.

Most appends are an aggregate's: a few events to one stream with an exact expected version.
For those, outside a caller's transaction, one ``WITH ... INSERT`` statement checks and bumps
the stream's row and inserts the events: no PL/pgSQL, no parameter arrays for one event, about
a third of the server time of ``lakefold.append_events``. Ordinals start at 0 because the
statement is its own transaction. When the check fails the statement writes nothing and
returns no row; the caller then goes through ``append_events``, which raises the precise error
(or, for an idempotent retry, finds the original events).

A one-event append, the commonest call of all, skips psycopg's query machinery too: its
statement is prepared under a fixed name on each connection the first time it is used there
(``PREPARE`` by the libpq API, and again if the server forgot it), and executed by one
blocking libpq call (``PQexecPrepared``, which releases the interpreter lock while it waits)
with its arguments already as UTF-8 text. Converting a query and adapting a dozen arguments
costs ~25 µs of Python per call, as much as the rest of the client's round trip; and psycopg's
non-blocking wait gives up and retakes the interpreter lock several times per statement, which
with 16 writer threads costs more than the work itself (16 writers: ~5.5k -> ~6.3k appends/s).
That is for appends off the main thread (where signals never arrive); on the main thread
the statement runs through psycopg's wait, so Ctrl-C still interrupts an append that waits
for another transaction's lock on its stream.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

import psycopg
from psycopg import generators, pq, sql
from psycopg.rows import TupleRow

from lakefold.eventstore._copy import RUNS_INSERT, expected_code
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
    "FROM s), r AS ({runs}SELECT 0, 0, %(category)s::text, %(type)s::text FROM s) "
    "SELECT prev FROM s"
)
# The runs (see ``_ddl``): islands of consecutive events of one type.
_MANY: Final = sql.SQL(
    "WITH s AS ({step}), i AS ({insert}"
    "SELECT x.o - 1, x.i, %(stream)s::text, s.prev + x.o, %(category)s::text, x.t, x.v, "
    "x.d::json, COALESCE(x.m::jsonb, '{{}}'::jsonb), x.c, x.z "
    "FROM s, unnest(%(ids)b::uuid[], %(types)b::text[], %(versions)b::integer[], "
    "%(data)b::text[], %(metadata)b::text[], %(correlation)b::uuid[], %(causation)b::uuid[]) "
    "WITH ORDINALITY AS x(i, t, v, d, m, c, z, o)), r AS ({runs}"
    "SELECT min(g.o) - 1, max(g.o) - 1, %(category)s::text, g.t FROM s, ("
    " SELECT x.t, x.o, x.o - row_number() OVER (PARTITION BY x.t ORDER BY x.o) AS island"
    " FROM unnest(%(types)b::text[]) WITH ORDINALITY AS x(t, o)) AS g GROUP BY g.t, g.island) "
    "SELECT prev FROM s"
)
# Rendered to text once: psycopg renders a Composed query again on every execute (tens of µs,
# a large share of a one-event append), but parses a str query once and caches the result.
_STATEMENTS: Final = {
    kind: _MANY.format(step=step, insert=_INSERT, runs=RUNS_INSERT).as_string()
    for kind, step in _STREAM_STEP.items()
}


def _numbered(text: str) -> tuple[bytes, tuple[str, ...]]:
    """``text`` with its named placeholders as ``$1, $2...`` in order of first use, and the
    names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text).encode(), tuple(names)


#: kind -> (prepared statement name, its text, the argument names in ``$n`` order).
_ONE_EVENT: Final = {
    kind: (f"lakefold_append_one_{kind}".encode(),
           *_numbered(_ONE.format(step=step, insert=_INSERT, runs=RUNS_INSERT).as_string()))
    for kind, step in _STREAM_STEP.items()
}
_UNDEFINED_STATEMENT: Final = b"26000"


# The stream step for each SQL code of an expected version (``expected_code``); any other
# code is an exact version.
_KIND_OF_CODE: Final = {None: "any", -1: "new", -2: "exists"}


def _text(value: object) -> bytes | None:
    return None if value is None else str(value).encode()


def _checked(pgconn: pq.abc.PGconn, result: pq.abc.PGresult, ok: pq.ExecStatus
             ) -> pq.abc.PGresult:
    """``result`` if its status is ``ok``; otherwise the psycopg error it carries (an
    ``OperationalError`` when the connection is lost, as psycopg itself reports that)."""
    if result.status == ok:
        return result
    error = psycopg.errors.error_from_result(result)
    if pgconn.status == pq.ConnStatus.BAD:
        raise psycopg.OperationalError(str(error)) from error
    raise error


def _run(conn: psycopg.Connection[TupleRow], send: Callable[[], None],
         block: Callable[[], pq.abc.PGresult]) -> pq.abc.PGresult:
    """One libpq command's result. Off the main thread, one blocking call (``block``), which
    releases the interpreter lock once while it waits; signals reach only the main thread, so
    nothing is lost there. On the main thread, ``send`` and psycopg's wait, which Ctrl-C
    interrupts (cancelling the statement)."""
    if threading.current_thread() is not threading.main_thread():
        return block()
    send()
    result: pq.abc.PGresult = conn.wait(generators.execute(conn.pgconn))[-1]
    return result


def _execute_prepared(conn: psycopg.Connection[TupleRow], name: bytes, text: bytes,
                      args: Sequence[bytes | None]) -> pq.abc.PGresult:
    """Run prepared statement ``name`` (preparing it from ``text`` first when the connection
    does not have it yet); its result, or the psycopg error of a failure."""
    pgconn = conn.pgconn
    # None is NULL, in both pq implementations (exec_prepared's annotation leaves it out,
    # send_query_prepared's has it)
    values = cast("Sequence[bytes]", args)
    with conn.lock:
        result = _run(conn, lambda: pgconn.send_query_prepared(name, args),
                      lambda: pgconn.exec_prepared(name, values))
        if (result.status == pq.ExecStatus.FATAL_ERROR
                and result.error_field(pq.DiagnosticField.SQLSTATE) == _UNDEFINED_STATEMENT):
            _checked(pgconn, _run(conn, lambda: pgconn.send_prepare(name, text),
                                  lambda: pgconn.prepare(name, text)),
                     pq.ExecStatus.COMMAND_OK)
            result = _run(conn, lambda: pgconn.send_query_prepared(name, args),
                          lambda: pgconn.exec_prepared(name, values))
    return _checked(pgconn, result, pq.ExecStatus.TUPLES_OK)


def _append_one(conn: psycopg.Connection[TupleRow], append: StreamAppend, kind: str
                ) -> int | None:
    encoded = append.events[0]
    event = encoded.event
    metadata = event.metadata
    values: dict[str, bytes | None] = {
        "stream": append.stream_id.encode(), "category": append.category.encode(), "n": b"1",
        "expected": _text(append.expected_version if kind == "exact" else None),
        "id": event.event_id.hex.encode(), "type": event.type.encode(),
        "version": _text(event.schema_version), "data": encoded.data_json.encode(),
        "metadata": None if encoded.metadata_json == "{}" else encoded.metadata_json.encode(),
        "correlation": _text(metadata.correlation_id), "causation": _text(metadata.causation_id),
    }
    name, text, names = _ONE_EVENT[kind]
    result = _execute_prepared(conn, name, text, [values[n] for n in names])
    if result.ntuples == 0:
        return None
    prev = result.get_value(0, 0)
    return None if prev is None else int(prev)


def fast_append(conn: psycopg.Connection[TupleRow], append: StreamAppend) -> int | None:
    """Append one stream's events on an autocommit ``conn``; the stream's version before the
    append, or None when the expected version (or deletion state) did not allow it and
    nothing was written."""
    kind = _KIND_OF_CODE.get(expected_code(append.expected_version), "exact")
    events = append.events
    if len(events) == 1:
        return _append_one(conn, append, kind)
    params: dict[str, Any] = {
        "stream": append.stream_id, "category": append.category, "n": len(events),
        "expected": append.expected_version if kind == "exact" else None,
        "ids": [e.event.event_id for e in events], "types": [e.event.type for e in events],
        "versions": [e.event.schema_version for e in events],
        "data": [e.data_json for e in events],
        "metadata": [None if e.metadata_json == "{}" else e.metadata_json for e in events],
        "correlation": [e.event.metadata.correlation_id for e in events],
        "causation": [e.event.metadata.causation_id for e in events],
    }
    row = conn.execute(_STATEMENTS[kind], params, prepare=True).fetchone()
    return None if row is None else int(row[0])
