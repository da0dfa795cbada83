"""The history of a captured table: every version of every row by commit LSN (SCD2), kept by
lakefold, so that a view can read a row *as of* a point of the source's commit order.

A changelog stream holds every version only until compaction removes the superseded ones; a
history keeps them. ``lakefold.table_histories`` registers one history per stream, shared by
every view that reads it: its table in ``lakefold_state``, ``position`` (the first stream
position not copied yet) and ``start_lsn`` (below). ``advance`` copies the stream's records up
to its head in the caller's transaction. The history is a durable reader of the stream from
the moment it is created, so compaction never removes a record it has not copied.

Versions: one row per record (insert, update, snapshot read, delete), keyed by the changelog's
key bytes, with its commit LSN and position; a truncate is a row without a key. ``as_of``
gives, for each (key, LSN), the last version with ``commit_lsn <= LSN``, unless that version
is a delete or a truncate committed at or before the LSN came after it: the row as the
transaction committing at that LSN left it (its own changes included).

Where the history begins. A stream starts with a snapshot (the rows at one LSN, or chunks of
an incremental snapshot at several), and compaction may have removed older versions before the
history was created. Below ``start_lsn`` (the largest commit LSN of the stream's leading
snapshot records and of the records up to compaction's ``removed_to``) the history does not
know every version, so a lookup at an earlier LSN is answered as of ``start_lsn``: the oldest
state it knows whole. Answers at LSNs the capture has stored are final: records stored later
commit later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import psycopg
import pyarrow as pa
from psycopg import sql

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.projections.state._stream_state import STATE_SCHEMA, install_states, stage_records
from lakefold.store.internals import StreamMeta, copy_records, reader_registry, stream_meta, typed

#: The durable reader name of every history.
HISTORY_READER: Final = "lakefold:history"

_DDL: Final = """
CREATE TABLE IF NOT EXISTS lakefold.table_histories (
    stream text PRIMARY KEY,
    table_name text NOT NULL UNIQUE,
    position bigint NOT NULL DEFAULT 1,
    start_lsn bigint,
    created_at timestamptz NOT NULL DEFAULT now()
)"""
COMPONENT: Final = migrations.register(
    "table_histories", Migration(1, "registry of the tables' histories", _DDL))
_COLUMNS: Final = sql.SQL(
    "key, commit_lsn, position, ordinal, xid, commit_ts, schema_version, op, after")


def history_table_name(stream: str) -> str:
    return "h_" + hashlib.sha256(stream.encode()).hexdigest()[:32]


class TableHistory:
    """The history of ``stream`` (see the module docstring). Every method takes the
    connection to use, so a caller puts a history's changes in its own transaction."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.table = sql.Identifier(STATE_SCHEMA, history_table_name(stream))
        self._meta: StreamMeta | None = None

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the history (idempotent) and hold the stream's compaction from position 0."""
        install_states(conn)
        name = history_table_name(self.stream)
        with conn.transaction():
            migrations.migrate(conn, COMPONENT)
            # the history itself: one table per stream, named after it (not a migration)
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key bytea, commit_lsn bigint NOT NULL, "
                "position bigint PRIMARY KEY, ordinal bigint NOT NULL, xid bigint NOT NULL, "
                "commit_ts timestamptz NOT NULL, schema_version integer NOT NULL, "
                "op \"char\" NOT NULL, after text[])").format(self.table))
            conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (key, commit_lsn, "
                                 "position)").format(sql.Identifier(f"{name}_k"), self.table))
            conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (position) "
                                 "WHERE key IS NULL").format(sql.Identifier(f"{name}_t"),
                                                             self.table))
            created = conn.execute(
                "INSERT INTO lakefold.table_histories (stream, table_name) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING", (self.stream, name)).rowcount
            meta = self._meta = stream_meta(conn, self.stream)
            if created:
                reader_registry.commit(conn, HISTORY_READER, meta.info.stream_id,
                                        self.stream, 0, history=False)

    def position(self, conn: psycopg.Connection[Any]) -> int:
        """The first stream position not copied yet."""
        row = conn.execute("SELECT position FROM lakefold.table_histories WHERE stream = %s",
                           (self.stream,)).fetchone()
        return 1 if row is None else int(row[0])

    def advance(self, conn: psycopg.Connection[Any]) -> int:
        """Copy the stream's records up to its head (in the caller's transaction; concurrent
        callers take turns); returns the next position to copy."""
        with conn.transaction():
            row = conn.execute("SELECT position, start_lsn FROM lakefold.table_histories "
                               "WHERE stream = %s FOR UPDATE", (self.stream,)).fetchone()
            assert row is not None  # noqa: S101 - create() runs first
            start, start_lsn = int(row[0]), row[1]
            meta = self._meta = stream_meta(conn, self.stream)
            end = meta.info.head + 1
            if end <= start:
                return start
            staged = stage_records(conn, meta, start, end)
            if start_lsn is None:
                start_lsn = self._start_lsn(conn, staged, meta)
            conn.execute(sql.SQL(
                "INSERT INTO {} ({}) SELECT CASE WHEN op = 't' THEN NULL ELSE key END, "
                "commit_lsn, position, ordinal, xid, commit_ts, schema_version, op, after "
                "FROM {}").format(self.table, _COLUMNS, staged))
            conn.execute(sql.SQL("DELETE FROM {}").format(staged))
            conn.execute("UPDATE lakefold.table_histories SET position = %s, start_lsn = %s "
                         "WHERE stream = %s", (end, start_lsn, self.stream))
            reader_registry.commit(conn, HISTORY_READER, meta.info.stream_id, self.stream,
                                    end - 1, history=False)
        return end

    def _start_lsn(self, conn: psycopg.Connection[Any], staged: sql.Identifier,
                   meta: StreamMeta) -> int:
        """The first copy's ``start_lsn`` (see the module docstring)."""
        state = reader_registry.state(conn, meta.info.stream_id, self.stream)
        row = conn.execute(sql.SQL(
            "SELECT max(commit_lsn) FROM {s} WHERE position <= greatest(%s::bigint, coalesce("
            "(SELECT min(position) FROM {s} WHERE op <> 'r') - 1, %s::bigint))").format(
                s=staged), (state.removed_to, 2**63 - 1)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def as_of(self, conn: psycopg.Connection[Any], keys: Sequence[bytes | None],
              lsns: Sequence[int]) -> pa.Table:
        """For each ``(keys[i], lsns[i])``, the row as of that commit LSN (see the module
        docstring): a typed table (metadata columns first) of the rows found, where
        ``_ordinal`` is the ``i`` they answer (no row: none found)."""
        meta = self._meta = stream_meta(conn, self.stream)
        row = conn.execute("SELECT coalesce(start_lsn, 0) FROM lakefold.table_histories "
                           "WHERE stream = %s", (self.stream,)).fetchone()
        start_lsn = int(row[0]) if row is not None else 0
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE lf_history_lookup (i bigint, key bytea, "
                         "lsn bigint) ON COMMIT DROP")
            with conn.cursor() as cur, cur.copy(
                    "COPY lf_history_lookup (i, key, lsn) FROM STDIN") as copy:
                for i, (key, lsn) in enumerate(zip(keys, lsns, strict=True)):
                    if key is not None:
                        copy.write_row((i, key, max(lsn, start_lsn)))
            conn.execute("ANALYZE lf_history_lookup")
            found = copy_records(conn, meta, sql.SQL(
                "SELECT h.position, h.op, h.commit_lsn, q.i AS ordinal, h.xid, h.commit_ts, "
                "h.schema_version, h.after AS v FROM lf_history_lookup q "
                "CROSS JOIN LATERAL (SELECT * FROM {h} h WHERE h.key = q.key "
                "AND h.commit_lsn <= q.lsn ORDER BY h.commit_lsn DESC, h.position DESC "
                "LIMIT 1) h WHERE h.op <> 'd' AND NOT EXISTS (SELECT 1 FROM {h} t "
                "WHERE t.key IS NULL AND t.position > h.position AND t.commit_lsn <= q.lsn)")
                .format(h=self.table))
            conn.execute("DROP TABLE lf_history_lookup")
        return typed(found, meta)
