"""Large appends by COPY: the client streams rows while the server inserts them.

``append_events`` takes the whole append as one statement, so the client builds every row
before the server starts and the server parses every row before it inserts: the two work in
turn. For appends of ``COPY_THRESHOLD`` events or more, ``copy_append`` instead reserves the
stream versions and the transaction's ordinals (``lakefold.reserve_versions`` and
``lakefold.take_ordinals``, with the same checks and errors as ``append_events``) and then
streams the rows with ``COPY``, in chunks, so client and server work at the same time, on the
two cores of a small machine. It must run inside a transaction: a failure anywhere rolls the
whole append back.

The events arrive in ``StreamedEvents`` (see ``_model.build_appends``): each is validated and
encoded just before its row is built, so the client's encoding overlaps the server's inserts
too. An invalid event raises in the middle of the stream; psycopg then ends the COPY with an
error, the server discards every row of it, and the caller's transaction rolls back, so
nothing of the append is written and the caller gets the validation error itself.

The rows go to the server in chunks of ``_CHUNK`` events (small, so that the server's share
left after the last row, which the client waits for, is small too). The append's runs (see
``_ddl``: ranges of consecutive ordinals with one stream and type) are gathered while the
rows are built and inserted after the COPY; in a transaction of its own, together with the
``COMMIT``.

The rows go in COPY's text format, built with one f-string per event: the JSON payloads are
already text, the per-stream fields are escaped once per append, and ids go as 32 hex digits
(which ``uuid`` accepts). That is about three times less Python per event than handing each
field to a binary dumper (``write_row``); the server's work is the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from lakefold.eventstore._model import Expected, ExpectedVersion, StreamAppend

#: Appends of at least this many events go through COPY.
COPY_THRESHOLD: Final = 200

_RESERVE: Final = sql.SQL(
    "SELECT lakefold.reserve_versions({}::text[], {}::text[], {}::bigint[], {}::integer[]), "
    "lakefold.take_ordinals({}::integer)"
)
# Inside a caller's transaction: parameters, after the savepoint ``append_on`` opened.
_RESERVE_PARAMS: Final = _RESERVE.format(*[sql.Placeholder(format="b")] * 5).as_string()
_COPY: Final = (
    "COPY lakefold.events (ordinal, event_id, stream_id, stream_version, category, type, "
    "schema_version, data, metadata, correlation_id, causation_id) FROM STDIN"
)
#: The start of every insert of runs (see ``_ddl``) from Python; the row source follows.
RUNS_INSERT: Final = sql.SQL(
    "INSERT INTO lakefold.event_runs (first_ordinal, last_ordinal, category, type) ")
# The append's runs, gathered while its rows are built.
_RUNS: Final = sql.SQL(
    "{insert}SELECT * FROM unnest({}::integer[], {}::integer[], {}::text[], {}::text[])")
_RUNS_PARAMS: Final = _RUNS.format(*[sql.Placeholder(format="b")] * 4,
                                   insert=RUNS_INSERT).as_string()
#: Events per chunk handed to the server while the next chunk is built.
_CHUNK: Final = 64
_NULL: Final = "\\N"


def _escape(text: str) -> str:
    """``text`` as a field of COPY's text format (backslash, newline, CR and tab escaped)."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\n" in text or "\r" in text or "\t" in text:
        text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text


def _uuid_field(value: uuid.UUID | None) -> str:
    return _NULL if value is None else f"{value.int:032x}"


def expected_code(expected: ExpectedVersion) -> int | None:
    """The SQL encoding of an expected version: NULL any, -1 no stream, -2 stream exists."""
    if expected is Expected.ANY:
        return None
    if expected is Expected.NO_STREAM:
        return -1
    if expected is Expected.STREAM_EXISTS:
        return -2
    return expected


def copy_append(conn: psycopg.Connection[TupleRow], appends: Sequence[StreamAppend], *,
                begin: bool) -> list[int]:
    """Append by COPY on ``conn``; returns each stream's version before the append. Raises
    the same psycopg errors as ``append_events``.

    ``begin=False``: ``conn`` is inside a transaction already, which the caller ends.
    ``begin=True``: ``conn`` is idle; the transaction starts with the reservation, in the same
    round trip (``BEGIN`` and the reservation as one simple query, with the arguments as
    literals), and commits with the insert of the runs, again in one round trip. On any error
    the caller rolls back."""
    args = (
        [a.stream_id for a in appends], [a.category for a in appends],
        [expected_code(a.expected_version) for a in appends], [len(a.events) for a in appends],
        sum(len(a.events) for a in appends),
    )
    if begin:
        cursor = conn.execute(
            sql.SQL("BEGIN; {}").format(_RESERVE.format(*map(sql.Literal, args))))
        cursor.nextset()  # the reservation's result follows BEGIN's
        row = cursor.fetchone()
    else:
        row = conn.execute(_RESERVE_PARAMS, args).fetchone()
    if row is None:  # pragma: no cover - a SELECT of two functions returns one row
        raise psycopg.DataError("reserving versions returned no row")
    prev_versions: list[int] = row[0]
    ordinal: int = row[1]
    types: dict[str, str] = {}
    rows: list[str] = []
    # the runs: first and last ordinals, categories, types; the open run's type
    firsts: list[int] = []
    lasts: list[int] = []
    run_categories: list[str] = []
    run_types: list[str] = []
    run_type: str | None = None
    with conn.cursor().copy(_COPY) as copy:
        for append, prev in zip(appends, prev_versions, strict=True):
            stream = f"{_escape(append.stream_id)}\t"
            category = f"\t{_escape(append.category)}\t"
            run_type = None  # every stream opens a new run
            version = prev
            for encoded in append.events:
                event = encoded.event
                meta = event.metadata
                type_field = types.get(event.type)
                if type_field is None:
                    type_field = types[event.type] = _escape(event.type)
                if event.type != run_type:
                    if firsts:
                        lasts.append(ordinal - 1)
                    run_type = event.type
                    firsts.append(ordinal)
                    run_categories.append(append.category)
                    run_types.append(run_type)
                version += 1
                metadata = encoded.metadata_json
                rows.append(
                    f"{ordinal}\t{event.event_id.int:032x}\t{stream}{version}{category}"
                    f"{type_field}\t{event.schema_version}\t{_escape(encoded.data_json)}\t"
                    f"{metadata if metadata == '{}' else _escape(metadata)}\t"
                    f"{_uuid_field(meta.correlation_id)}\t{_uuid_field(meta.causation_id)}\n")
                ordinal += 1
                if len(rows) == _CHUNK:
                    copy.write("".join(rows))
                    rows.clear()
        if rows:
            copy.write("".join(rows))
    lasts.append(ordinal - 1)
    runs = (firsts, lasts, run_categories, run_types)
    if begin:
        conn.execute(sql.SQL("{}; COMMIT").format(
            _RUNS.format(*map(sql.Literal, runs), insert=RUNS_INSERT)))
    else:
        conn.execute(_RUNS_PARAMS, runs)
    return prev_versions
