"""Commit markers: where each append sits in the database's commit order.

Global positions follow transaction ids (see ``_sequencer``), not commit order, and say nothing
about the captured tables of the same database. A view that enriches an event with a table's
row *as of the event's commit* (``lakefold.projections``' ``lookup``) needs the commit LSN of
the event's transaction, on the scale of the table's changelog records.

With markers installed (``install_commit_markers``, idempotent; a view with such a lookup does
it), every statement that appends events (each one inserts into ``lakefold.event_runs``) also
writes a *transactional* logical decoding message, prefix ``lakefold.event_commit``, holding
the transaction's 64-bit id. PostgreSQL decodes it at the transaction's commit, so a capture of
this database (``lakefold.capture``'s in-band messages) stores ``(xid, commit_lsn)`` in the
same store transaction as the records committed around it. A marker costs one small WAL record
per append statement (any ``wal_level``, any role: ``pg_logical_emit_message`` needs neither);
nothing decodes it until a capture does.

``transaction_ranges`` maps positions to their transactions (``lakefold.event_positions``),
and ``wal_insert_lsn`` reads the WAL position that a capture must have passed before the
markers of every event committed so far are stored.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from lakefold.core.wal import COMMIT_MARKER_PREFIX

_INSTALL: Final = """
CREATE OR REPLACE FUNCTION lakefold.event_commit_marker() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_logical_emit_message(true, '@PREFIX@',
                                    pg_current_xact_id()::text);
    RETURN NULL;
END
$fn$;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                   WHERE tgrelid = 'lakefold.event_runs'::regclass
                     AND tgname = 'event_commit_marker') THEN
        CREATE TRIGGER event_commit_marker AFTER INSERT ON lakefold.event_runs
            FOR EACH STATEMENT EXECUTE FUNCTION lakefold.event_commit_marker();
    END IF;
END
$do$;
""".replace("@PREFIX@", COMMIT_MARKER_PREFIX)


def markers_installed(conn: psycopg.Connection[Any]) -> bool:
    """True when appends write commit markers."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgname = "
        "'event_commit_marker' AND tgrelid = to_regclass('lakefold.event_runs'))").fetchone()
    return bool(row and row[0])


def install_commit_markers(conn: psycopg.Connection[Any]) -> bool:
    """Make every later append write a commit marker (idempotent); False when there is no
    event store yet. Creating the trigger waits for appends in flight (a short table lock);
    appends after it carry markers."""
    row = conn.execute("SELECT to_regclass('lakefold.event_runs') IS NULL").fetchone()
    if row and row[0]:
        return False  # no event store yet
    if markers_installed(conn):
        return True
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '10s'")
        conn.execute(_INSTALL)
    return True


def transaction_ranges(conn: psycopg.Connection[Any], start: int, end: int
                       ) -> list[tuple[int, int, int]]:
    """``(first_position, events, xid)`` of the transactions whose positions meet
    ``[start, end)``, in position order."""
    row = conn.execute("SELECT to_regclass('lakefold.event_positions') IS NULL").fetchone()
    if row and row[0]:
        return []  # no event store: no events
    return [(int(a), int(b), int(c)) for a, b, c in conn.execute(
        "SELECT first_position, events, xid::text::bigint FROM lakefold.event_positions "
        "WHERE first_position < %s AND first_position + events > %s ORDER BY first_position",
        (end, start)).fetchall()]


def wal_insert_lsn(conn: psycopg.Connection[Any]) -> int:
    """The database's WAL insert position: every transaction committed before this call
    ends at or before it."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None  # noqa: S101 - a SELECT without FROM returns a row
    return int(row[0])


def database_identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """(system identifier, database name): what a capture records of its source."""
    row = conn.execute("SELECT system_identifier::text, current_database() "
                       "FROM pg_control_system()").fetchone()
    assert row is not None  # noqa: S101 - the function returns one row
    return str(row[0]), str(row[1])
