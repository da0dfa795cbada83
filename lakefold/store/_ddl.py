"""The changelog store's tables, in schema ``lakefold`` of the store database.

``capture_slots``       one row per replication slot a capture owns: the de-duplication
                        checkpoint ``(commit_lsn, ordinal, complete)`` and the flush LSN,
                        written in the same transaction as the records they describe; the
                        source (server identity, database, ``host:port/database``) and the
                        stream prefix, which belongs to one source (``_sources``).
``changelog_streams``   one row per stream (captured table): ``head`` is the last position
                        readers may see; it only moves at source transaction boundaries.
``changelog_schemas``   the columns of each stream, per schema version.
``changelog``           the records. ``(stream_id, position)`` is the primary key; positions
                        are assigned densely from 1 by the capture, the only writer.
``changelog_segments``  runs of ``read`` records of an initial snapshot, one row per run (see
                        ``_snapshot_segments``); readers merge them with ``changelog`` by position.
``changelog_keys``      the latest compacted position of each key (kept by compaction).
``changelog_compaction`` how far each stream has been compacted, the highest positions
                        compaction removed a record at (any, and expired tombstones), and
                        whether the stream keeps its full history (never compacted).
``changelog_readers``   durable readers of a stream (projection generations, subscriptions)
                        and the position each has processed: compaction never passes the
                        lowest one (see ``_reader_registry``).
``capture_staging_<slot>`` per slot: rows of large in-progress transactions streamed by the
                        server (protocol v2), moved into ``changelog`` when they commit.
                        UNLOGGED and without indexes: it is emptied at every capture start.
``capture_rereads``     rows whose update could not be filled with an unchanged TOASTed
                        value; the capture reads them again, in-band (``_reread``).
``capture_messages``    logical decoding messages (``pg_logical_emit_message``) captured
                        when the capture is configured to keep them.
``event_commits``       the commit LSN of each event store append a slot decoded (its commit
                        marker, see ``eventstore._commit_markers``).
``capture_slot_intents`` slots being created: the store's intent, recorded before the slot
                        exists, so a crash in between is recognised (``_slot_intent``).
``capture_owners``      the live capture of each slot and take-over requests (``_slot_ownership``).

``store_installs``      the migrations applied to the store, of every component
                        (``lakefold.core.migrations``, which owns it).

``install`` migrates component ``changelog`` to its latest version: idempotent, safe to run
concurrently, and free of DDL when nothing is missing.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

from lakefold.core import migrations
from lakefold.core.migrations import Migration

SCHEMA: Final = "lakefold"
STORE_VERSION: Final = 1

_DDL: Final = """
CREATE TABLE IF NOT EXISTS lakefold.capture_slots (
    slot_name text PRIMARY KEY,
    publication text NOT NULL,
    source_system_id text NOT NULL,
    source_database text NOT NULL,
    commit_lsn bigint NOT NULL DEFAULT 0,
    ordinal bigint NOT NULL DEFAULT 0,
    complete boolean NOT NULL DEFAULT true,
    flush_lsn bigint NOT NULL DEFAULT 0,
    records bigint NOT NULL DEFAULT 0,
    last_commit_ts timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lakefold.changelog_streams (
    stream_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    slot_name text NOT NULL,
    source_database text NOT NULL,
    source_schema text NOT NULL,
    source_table text NOT NULL,
    head bigint NOT NULL DEFAULT 0,
    schema_version integer NOT NULL DEFAULT 0,
    last_commit_ts timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lakefold.changelog_schemas (
    stream_id integer NOT NULL REFERENCES lakefold.changelog_streams ON DELETE CASCADE,
    version integer NOT NULL,
    relation_oid bigint NOT NULL,
    replica_identity text NOT NULL,
    source_schema text NOT NULL,
    source_table text NOT NULL,
    columns jsonb NOT NULL,
    created_lsn bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_id, version)
);
CREATE TABLE IF NOT EXISTS lakefold.changelog (
    stream_id integer NOT NULL,
    position bigint NOT NULL,
    ordinal bigint NOT NULL,
    commit_lsn bigint NOT NULL,
    xid bigint NOT NULL,
    commit_ts timestamptz NOT NULL,
    schema_version integer NOT NULL,
    op "char" NOT NULL,
    key bytea,
    before text[],
    after text[],
    PRIMARY KEY (stream_id, position)
);
-- Tombstone and truncate expiry without scanning the stream (only deletes are indexed).
CREATE INDEX IF NOT EXISTS changelog_tombstone_idx ON lakefold.changelog (stream_id, position)
    WHERE op IN ('d', 't');
-- The latest compacted record of each key, maintained by compaction (not by the capture, whose
-- appends stay free of a key index; see _compaction).
CREATE TABLE IF NOT EXISTS lakefold.changelog_keys (
    stream_id integer NOT NULL,
    key bytea NOT NULL,
    position bigint NOT NULL,
    PRIMARY KEY (stream_id, key)
);
CREATE TABLE IF NOT EXISTS lakefold.changelog_compaction (
    stream_id integer PRIMARY KEY REFERENCES lakefold.changelog_streams ON DELETE CASCADE,
    compacted_to bigint NOT NULL DEFAULT 0,
    removed bigint NOT NULL DEFAULT 0,
    last_run timestamptz
);
-- Durable readers and the last position each has processed (committed after its effect):
-- compaction never removes a record after the lowest one of a stream (see _readers).
CREATE TABLE IF NOT EXISTS lakefold.changelog_readers (
    reader text NOT NULL,
    stream_id integer NOT NULL REFERENCES lakefold.changelog_streams ON DELETE CASCADE,
    position bigint NOT NULL,
    history boolean NOT NULL DEFAULT false,
    registered_at timestamptz NOT NULL DEFAULT now(),
    moved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (reader, stream_id)
);
CREATE INDEX IF NOT EXISTS changelog_readers_stream_idx
    ON lakefold.changelog_readers (stream_id, position);
-- Rows to read again in-band: an update whose unchanged TOASTed value had no earlier record
-- of its key to be filled from (see _toast); the control thread reads them (_reread).
CREATE TABLE IF NOT EXISTS lakefold.capture_rereads (
    slot_name text NOT NULL,
    stream_id integer NOT NULL,
    key bytea NOT NULL,
    schema_version integer NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot_name, stream_id, key)
);
-- Snapshot segments (_segments): positions first_position..last_position of a stream, all of
-- them ``read`` records of one schema version; ``rows`` and ``keys`` are compressed Arrow IPC.
CREATE TABLE IF NOT EXISTS lakefold.changelog_segments (
    stream_id integer NOT NULL,
    first_position bigint NOT NULL,
    last_position bigint NOT NULL,
    first_ordinal bigint NOT NULL,
    commit_lsn bigint NOT NULL,
    commit_ts timestamptz NOT NULL,
    schema_version integer NOT NULL,
    keys bytea NOT NULL,
    rows bytea NOT NULL,
    PRIMARY KEY (stream_id, first_position)
);
-- Already compressed: stored out of line as they are, not compressed again.
ALTER TABLE lakefold.changelog_segments ALTER keys SET STORAGE EXTERNAL,
    ALTER rows SET STORAGE EXTERNAL;
-- The last position a stream has stored, visible or not (its head, or beyond it while a batch
-- or a snapshot chunk is being written).
CREATE OR REPLACE FUNCTION lakefold.changelog_top(stream integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(greatest(
        (SELECT max(position) FROM lakefold.changelog WHERE stream_id = stream),
        (SELECT max(last_position) FROM lakefold.changelog_segments WHERE stream_id = stream)),
        0)
$$;
-- Delete the records stored beyond the head of the given streams (a batch or a snapshot chunk a
-- crash left unfinished), rows and segments alike; returns how many records went.
CREATE OR REPLACE FUNCTION lakefold.changelog_drop_beyond_head(streams integer[])
RETURNS bigint LANGUAGE sql AS $$
    WITH rows AS (
        DELETE FROM lakefold.changelog c USING lakefold.changelog_streams s
        WHERE c.stream_id = s.stream_id AND s.stream_id = ANY(streams) AND c.position > s.head
        RETURNING 1),
    segments AS (
        DELETE FROM lakefold.changelog_segments c USING lakefold.changelog_streams s
        WHERE c.stream_id = s.stream_id AND s.stream_id = ANY(streams)
          AND c.first_position > s.head
        RETURNING c.last_position - c.first_position + 1 AS n)
    SELECT (SELECT count(*) FROM rows) + (SELECT coalesce(sum(n), 0) FROM segments)
$$;
CREATE TABLE IF NOT EXISTS lakefold.capture_messages (
    slot_name text NOT NULL,
    lsn bigint NOT NULL,
    commit_lsn bigint,
    ordinal bigint NOT NULL,
    transactional boolean NOT NULL,
    prefix text NOT NULL,
    content bytea NOT NULL,
    PRIMARY KEY (slot_name, lsn, ordinal)
);
-- Commit markers of event store appends decoded by a slot (eventstore._commit_markers): the
-- commit LSN of each appending transaction, on the scale of the changelog's commit_lsn.
CREATE TABLE IF NOT EXISTS lakefold.event_commits (
    xid bigint NOT NULL,
    slot_name text NOT NULL,
    commit_lsn bigint NOT NULL,
    PRIMARY KEY (xid, slot_name)
);
-- A slot being created (_slot_intent): recorded before CREATE_REPLICATION_SLOT, removed in the
-- transaction that registers the slot in capture_slots; wal_lsn is the source's WAL insert
-- position before the creation (the slot's restart LSN cannot be older).
CREATE TABLE IF NOT EXISTS lakefold.capture_slot_intents (
    slot_name text PRIMARY KEY,
    source_system_id text NOT NULL,
    source_database text NOT NULL,
    wal_lsn bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
-- The live capture of each slot (_ownership): the holder of the slot's advisory lock (token,
-- host, pid, its lock session, since when) and a pending take-over request.
CREATE TABLE IF NOT EXISTS lakefold.capture_owners (
    slot_name text PRIMARY KEY,
    token text,
    host text,
    pid integer,
    session_pid integer,
    started_at timestamptz,
    takeover_host text,
    takeover_pid integer,
    takeover_at timestamptz
);
"""

#: Versions during which the source table had no key (after the first release).
_KEYLESS: Final = """
-- Added after the first release: versions during which the source table had no key.
ALTER TABLE lakefold.changelog_schemas ADD COLUMN IF NOT EXISTS keyless boolean NOT NULL
    DEFAULT false;
"""

#: What compaction removed (after the first release).
_COMPACTION_EXTENT: Final = """
-- Added after the first release. Stores compacted before it: what compaction removed is not
-- known, so everything up to compacted_to counts as removed (readers below it must rebuild).
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'lakefold'
                   AND table_name = 'changelog_compaction' AND column_name = 'removed_to') THEN
        ALTER TABLE lakefold.changelog_compaction
            ADD COLUMN removed_to bigint NOT NULL DEFAULT 0,
            ADD COLUMN expired_to bigint NOT NULL DEFAULT 0,
            ADD COLUMN keep_history boolean,  -- null: nobody decided (a history view may ask)
            ADD COLUMN keep_history_reason text;
        UPDATE lakefold.changelog_compaction SET removed_to = compacted_to,
            expired_to = compacted_to WHERE removed > 0;
    END IF;
END $$;
"""

#: Where each capture reads and how it names its streams (after the first release).
_CAPTURE_SOURCE: Final = """
-- Added after the first release: the capture's source as it may be shown (host:port/database,
-- never a role or a password) and its stream prefix (null: recorded before this version; the
-- prefix is then read off the slot's streams, see capture.operations._sources).
ALTER TABLE lakefold.capture_slots ADD COLUMN IF NOT EXISTS source text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS stream_prefix text;
"""

COMPONENT: Final = migrations.register(
    "changelog",
    Migration(1, "changelog store and capture slots", _DDL),
    Migration(2, "changelog_schemas.keyless", _KEYLESS),
    Migration(3, "changelog_compaction: removed_to, expired_to, keep_history", _COMPACTION_EXTENT),
    Migration(4, "capture_slots: source, stream_prefix", _CAPTURE_SOURCE),
)

_STAGING_DDL: Final = """
CREATE UNLOGGED TABLE IF NOT EXISTS lakefold.{} (
    xid bigint NOT NULL,
    subxid bigint NOT NULL,
    seq bigint NOT NULL,
    stream_seq bigint NOT NULL,
    stream_id integer NOT NULL,
    schema_version integer NOT NULL,
    op "char" NOT NULL,
    key bytea,
    before text[],
    after text[]
)
"""


def staging_table(slot: str) -> sql.Identifier:
    """The staging table of ``slot`` (schema-qualified)."""
    return sql.Identifier("lakefold", f"capture_staging_{slot}")


def create_staging(conn: psycopg.Connection[Any], slot: str) -> None:
    """Create the slot's staging table if missing."""
    conn.execute(sql.SQL(_STAGING_DDL).format(sql.Identifier(f"capture_staging_{slot}")))


def drop_staging(conn: psycopg.Connection[Any], slot: str) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(staging_table(slot)))


def install(conn: psycopg.Connection[Any]) -> None:
    """Create schema ``lakefold`` and the changelog tables, or bring them to the latest version
    (``lakefold.core.migrations``): idempotent, safe to run concurrently, and without any DDL
    when the store is up to date (an ``ALTER`` takes table locks that running views and
    captures hold)."""
    migrations.migrate(conn, COMPONENT)


def is_installed(conn: psycopg.Connection[Any]) -> bool:
    """True when the changelog tables exist in the store."""
    row = conn.execute("SELECT to_regclass('lakefold.changelog') IS NOT NULL").fetchone()
    return bool(row and row[0])
