"""Store tables of snapshots and capture control, next to the changelog (schema ``lakefold``).

``capture_snapshots``        one row per snapshot run: the initial snapshot of a slot, or an
                             incremental re-snapshot of some tables; its status and error.
``capture_snapshot_tables``  per snapshot and table: status, the key of the last row copied
                             (the chunk boundary a resumed run continues after), rows, chunks.
``capture_control``          per slot: paused or not, and the capture's last error.
``capture_scopes``           per slot: its publication and what it covers (a schema or listed
                             tables), for ``capture status`` (``_publishable``).
``capture_heartbeats``       the last heartbeats a capture wrote into the source's WAL: their
                             LSN and time (for lag in seconds), and when they were stored.

Chunk progress of the initial snapshot is written in the same store transaction as the
chunk's records, so it is exact after a crash. ``install`` is idempotent and concurrency-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration

_DDL: Final = """
CREATE TABLE IF NOT EXISTS lakefold.capture_snapshots (
    snapshot_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot_name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('initial', 'incremental')),
    consistent_lsn bigint,
    status text NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'failed', 'abandoned')),
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS capture_snapshots_slot_idx
    ON lakefold.capture_snapshots (slot_name, status);
CREATE TABLE IF NOT EXISTS lakefold.capture_snapshot_tables (
    snapshot_id bigint NOT NULL REFERENCES lakefold.capture_snapshots ON DELETE CASCADE,
    relid bigint NOT NULL,
    ord integer NOT NULL,
    source_schema text NOT NULL,
    source_table text NOT NULL,
    stream text NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'copying', 'done')),
    last_key text[],
    rows bigint NOT NULL DEFAULT 0,
    chunks integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (snapshot_id, relid)
);
CREATE TABLE IF NOT EXISTS lakefold.capture_control (
    slot_name text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    paused_at timestamptz,
    last_error text,
    last_error_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lakefold.capture_scopes (
    slot_name text PRIMARY KEY,
    publication text NOT NULL,
    schema_name text,
    table_schemas text[] NOT NULL DEFAULT '{}',
    table_names text[] NOT NULL DEFAULT '{}',
    guarded boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lakefold.capture_heartbeats (
    slot_name text NOT NULL,
    lsn bigint NOT NULL,
    emitted_at timestamptz NOT NULL,
    stored_at timestamptz,
    PRIMARY KEY (slot_name, lsn)
);
"""

COMPONENT: Final = migrations.register(
    "capture_state", Migration(1, "snapshot runs, capture control, scopes, heartbeats", _DDL))

CONTROL_CHANNEL: Final = "lakefold_capture_control"


@dataclass(frozen=True, slots=True)
class SnapshotRun:
    """One snapshot run of a slot."""

    snapshot_id: int
    slot: str
    kind: str
    consistent_lsn: int | None
    status: str
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class SnapshotTable:
    """Progress of one table in a snapshot run; ``last_key`` is the text form of the order
    key of the last row copied (None: nothing copied yet)."""

    snapshot_id: int
    relid: int
    ord: int
    schema: str
    table: str
    stream: str
    status: str
    last_key: tuple[str, ...] | None
    rows: int
    chunks: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the snapshot and control tables if missing: migrates component
    ``capture_state`` (``lakefold.core.migrations``; idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


def is_installed(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('lakefold.capture_snapshots') IS NOT NULL").fetchone()
    return bool(row and row[0])


# -- snapshot runs -------------------------------------------------------------------------

def create_run(conn: psycopg.Connection[Any], *, slot: str, kind: str,
               consistent_lsn: int | None,
               tables: list[tuple[int, str, str, str]]) -> int:
    """Record a new snapshot run of ``tables`` (relid, schema, table, stream) and return its
    id. A new initial snapshot abandons earlier unfinished runs of the slot."""
    with conn.transaction(), conn.cursor() as cur:
        if kind == "initial":
            cur.execute(
                "UPDATE lakefold.capture_snapshots SET status = 'abandoned', finished_at = now() "
                "WHERE slot_name = %s AND status = 'running'", (slot,))
        return insert_run(cur, slot=slot, kind=kind, consistent_lsn=consistent_lsn,
                          tables=tables)


def insert_run(cur: psycopg.Cursor[Any], *, slot: str, kind: str, consistent_lsn: int | None,
               tables: list[tuple[int, str, str, str]]) -> int:
    """Insert a snapshot run of ``tables`` (relid, schema, table, stream) in the caller's
    transaction and return its id."""
    row = cur.execute(
        "INSERT INTO lakefold.capture_snapshots (slot_name, kind, consistent_lsn) "
        "VALUES (%s, %s, %s) RETURNING snapshot_id", (slot, kind, consistent_lsn),
    ).fetchone()
    if row is None:
        raise psycopg.DataError("INSERT ... RETURNING returned no row")
    snapshot_id = int(row[0])
    cur.executemany(
        "INSERT INTO lakefold.capture_snapshot_tables (snapshot_id, relid, ord, "
        "source_schema, source_table, stream) VALUES (%s, %s, %s, %s, %s, %s)",
        [(snapshot_id, relid, i, schema, table, stream)
         for i, (relid, schema, table, stream) in enumerate(tables)])
    return snapshot_id


def _run(row: Any) -> SnapshotRun:
    return SnapshotRun(int(row[0]), row[1], row[2], None if row[3] is None else int(row[3]),
                       row[4], row[5], row[6], row[7])


def runs(conn: psycopg.Connection[Any], slot: str, *, status: str | None = None,
         kind: str | None = None) -> list[SnapshotRun]:
    """The slot's snapshot runs, oldest first (optionally only one status / kind)."""
    if not is_installed(conn):
        return []
    rows = conn.execute(
        "SELECT snapshot_id, slot_name, kind, consistent_lsn, status, last_error, created_at, "
        "finished_at FROM lakefold.capture_snapshots WHERE slot_name = %s "
        "AND (%s::text IS NULL OR status = %s) AND (%s::text IS NULL OR kind = %s) "
        "ORDER BY snapshot_id", (slot, status, status, kind, kind),
    ).fetchall()
    return [_run(r) for r in rows]


def run_tables(conn: psycopg.Connection[Any], snapshot_id: int) -> list[SnapshotTable]:
    rows = conn.execute(
        "SELECT snapshot_id, relid, ord, source_schema, source_table, stream, status, "
        "last_key, rows, chunks FROM lakefold.capture_snapshot_tables WHERE snapshot_id = %s "
        "ORDER BY ord", (snapshot_id,),
    ).fetchall()
    return [SnapshotTable(int(r[0]), int(r[1]), int(r[2]), r[3], r[4], r[5], r[6],
                          None if r[7] is None else tuple(r[7]), int(r[8]), int(r[9]))
            for r in rows]


def record_chunk(conn: psycopg.Connection[Any] | psycopg.Cursor[Any], snapshot_id: int,
                 relid: int, *, last_key: tuple[str, ...] | None, rows: int,
                 done: bool) -> None:
    """Advance a table's progress by one chunk (call inside the chunk's store transaction)."""
    conn.execute(
        "UPDATE lakefold.capture_snapshot_tables SET last_key = COALESCE(%s, last_key), "
        "rows = rows + %s, chunks = chunks + 1, status = %s, updated_at = now() "
        "WHERE snapshot_id = %s AND relid = %s",
        (list(last_key) if last_key is not None else None, rows,
         "done" if done else "copying", snapshot_id, relid),
    )


def finish_run(conn: psycopg.Connection[Any], snapshot_id: int, *,
               error: str | None = None) -> None:
    """Mark a run done (or failed with ``error``)."""
    conn.execute(
        "UPDATE lakefold.capture_snapshots SET status = %s, last_error = %s, "
        "finished_at = now() WHERE snapshot_id = %s",
        ("failed" if error else "done", error, snapshot_id),
    )


# -- control: pause and last error ---------------------------------------------------------

def set_paused(conn: psycopg.Connection[Any], slot: str, paused: bool) -> None:
    """Pause or resume the capture of ``slot`` (a running capture notices within a second)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO lakefold.capture_control (slot_name, paused, paused_at) "
            "VALUES (%s, %s, CASE WHEN %s THEN now() END) ON CONFLICT (slot_name) DO UPDATE "
            "SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at, updated_at = now()",
            (slot, paused, paused))
        conn.execute("SELECT pg_notify(%s, %s)", (CONTROL_CHANNEL, slot))


def is_paused(conn: psycopg.Connection[Any], slot: str) -> bool:
    row = conn.execute("SELECT paused FROM lakefold.capture_control WHERE slot_name = %s",
                       (slot,)).fetchone()
    return bool(row and row[0])


def record_error(conn: psycopg.Connection[Any], slot: str, error: str | None) -> None:
    """Remember the capture's last error (None clears it)."""
    conn.execute(
        "INSERT INTO lakefold.capture_control (slot_name, last_error, last_error_at) "
        "VALUES (%s, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE now() END) "
        "ON CONFLICT (slot_name) DO UPDATE SET last_error = EXCLUDED.last_error, "
        "last_error_at = EXCLUDED.last_error_at, updated_at = now()",
        (slot, error, error))


def control(conn: psycopg.Connection[Any], slot: str) -> dict[str, Any]:
    """``paused``, ``paused_at``, ``last_error``, ``last_error_at`` of a slot."""
    row = conn.execute(
        "SELECT paused, paused_at, last_error, last_error_at FROM lakefold.capture_control "
        "WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return {"paused": False, "paused_at": None, "last_error": None, "last_error_at": None}
    return {"paused": bool(row[0]), "paused_at": row[1], "last_error": row[2],
            "last_error_at": row[3]}


# -- scope: what a slot's publication covers -------------------------------------------------

def record_scope(conn: psycopg.Connection[Any], slot: str, publication: str,
                 schema: str | None, tables: list[tuple[str, str]], *, guarded: bool) -> None:
    """Remember what ``slot``'s capture covers (a schema, or (schema, table) pairs) and
    whether the source's publication guard watches it."""
    conn.execute(
        "INSERT INTO lakefold.capture_scopes (slot_name, publication, schema_name, "
        "table_schemas, table_names, guarded) VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (slot_name) DO UPDATE SET publication = EXCLUDED.publication, "
        "schema_name = EXCLUDED.schema_name, table_schemas = EXCLUDED.table_schemas, "
        "table_names = EXCLUDED.table_names, guarded = EXCLUDED.guarded, updated_at = now()",
        (slot, publication, schema, [s for s, _ in tables], [t for _, t in tables], guarded))


def scope(conn: psycopg.Connection[Any],
          slot: str) -> tuple[str, str | None, list[tuple[str, str]], bool] | None:
    """(publication, schema, tables, guarded) recorded for ``slot``, or None."""
    if conn.execute("SELECT to_regclass('lakefold.capture_scopes')").fetchone() == (None,):
        return None
    row = conn.execute("SELECT publication, schema_name, table_schemas, table_names, guarded "
                       "FROM lakefold.capture_scopes WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    return (str(row[0]), row[1], list(zip(row[2], row[3], strict=True)), bool(row[4]))


def forget_scope(conn: psycopg.Connection[Any], slot: str) -> None:
    """Forget ``slot``'s scope (its capture was dropped)."""
    if conn.execute("SELECT to_regclass('lakefold.capture_scopes')").fetchone() != (None,):
        conn.execute("DELETE FROM lakefold.capture_scopes WHERE slot_name = %s", (slot,))


# -- heartbeats ----------------------------------------------------------------------------

def store_heartbeats(cur: psycopg.Cursor[Any], slot: str, beats: list[tuple[int, datetime]],
                     *, keep: int = 360) -> None:
    """Record heartbeats (LSN, time written) that the capture received and is storing in
    this transaction; keep only the slot's last ``keep``."""
    cur.executemany(
        "INSERT INTO lakefold.capture_heartbeats (slot_name, lsn, emitted_at, stored_at) "
        "VALUES (%s, %s, %s, now()) ON CONFLICT (slot_name, lsn) DO UPDATE "
        "SET stored_at = now()", [(slot, lsn, at) for lsn, at in beats])
    cur.execute(
        "DELETE FROM lakefold.capture_heartbeats WHERE slot_name = %s AND lsn < ("
        "SELECT min(lsn) FROM (SELECT lsn FROM lakefold.capture_heartbeats "
        "WHERE slot_name = %s ORDER BY lsn DESC LIMIT %s) k)", (slot, slot, keep))


def latest_heartbeat(conn: psycopg.Connection[Any], slot: str,
                     at_or_before: int | None = None) -> tuple[int, datetime] | None:
    """(LSN, time written) of the newest stored heartbeat (at or before an LSN)."""
    if not is_installed(conn):
        return None
    row = conn.execute(
        "SELECT lsn, emitted_at FROM lakefold.capture_heartbeats WHERE slot_name = %s "
        "AND stored_at IS NOT NULL AND (%s::bigint IS NULL OR lsn <= %s) "
        "ORDER BY lsn DESC LIMIT 1", (slot, at_or_before, at_or_before)).fetchone()
    return None if row is None else (int(row[0]), row[1])


def store_event_commits(cur: psycopg.Cursor[Any], slot: str,
                        commits: list[tuple[int, int]]) -> None:
    """Record the commit LSN of event store appends (xid, commit LSN) the capture decoded
    and is storing in this transaction (a transaction stored before is recorded once)."""
    cur.executemany(
        "INSERT INTO lakefold.event_commits (xid, slot_name, commit_lsn) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING", [(xid, slot, lsn) for xid, lsn in commits])


def event_commit_lsns(conn: psycopg.Connection[Any], slot: str, xids: list[int]
                      ) -> dict[int, int]:
    """The commit LSN of each of ``xids`` whose marker ``slot`` has stored."""
    return {int(x): int(lsn) for x, lsn in conn.execute(
        "SELECT xid, commit_lsn FROM lakefold.event_commits WHERE slot_name = %s "
        "AND xid = ANY(%s)", (slot, xids)).fetchall()}


def slot_flushed(conn: psycopg.Connection[Any], slot: str) -> tuple[int, str, str] | None:
    """(flush LSN, source system id, source database) of ``slot``: everything the source
    committed before the flush LSN is stored (None: no such slot)."""
    row = conn.execute("SELECT flush_lsn, source_system_id, source_database FROM "
                       "lakefold.capture_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))
