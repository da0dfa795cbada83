"""The event store's tables and server-side functions in schema ``lakefold``, and ``install()``.

Tables
------
``lakefold.streams``
    One row per stream: its current version (the version of its last event, 1-based; a stream
    with no row has no events) and its deletion state. Appends update this row, so two appends to
    the *same* stream serialise on its row lock while appends to different streams never wait
    for each other.
``lakefold.events``
    The append-only log. Each row records the top-level transaction id of its writer
    (``xid``, ``pg_current_xact_id()``) and its ``ordinal`` within that transaction (0, 1, 2...
    across all appends of the transaction); ``(xid, ordinal)`` is the primary key and the order
    of the global log (see ``_sequencer.py``). Besides the primary key, only ``event_id``
    (idempotent appends) and ``(stream_id, stream_version)`` (stream reads) are indexed per
    event; category and type reads go through ``event_runs``. ``deleted`` marks the events of
    a soft-deleted stream. ``data`` is ``json``,
    not ``jsonb``: the payload is stored as the text it arrived as, which spares every append
    building a jsonb tree and every read serialising it back (about 1 µs per event each way);
    cast it to ``jsonb`` to query it in SQL. ``metadata`` is ``jsonb``.
``lakefold.event_runs``
    The category and type index, one row per *run*: a maximal range of consecutive ordinals
    of one transaction whose events belong to one stream and have one type (a 1,000-event
    append of one type to one stream is one run). A large append writes one index row per
    run instead of two per event. Reading a category or types walks ``(category, xid,
    first_ordinal)`` or ``(type, xid, first_ordinal)`` and reads each run's events by one
    range of the events' primary key. Every run holds at least one event: deleting a
    stream marks its runs ``deleted`` with its events (soft) or deletes them with its
    events (hard). So ``limit`` runs from a position hold at least ``limit`` events, and a
    page of a category or of types reads at most ``limit`` runs, whatever the size of the
    category.
``lakefold.event_positions``
    One row per committed writer transaction, written by the sequencer once the transaction is
    final: the transaction's first global position. An event's position is
    ``first_position + ordinal``: dense, 1-based, assigned once and never changed (an erased
    event leaves a hole). Sequencing costs one row per transaction, not one per event.
``lakefold.event_sequencer``
    The single-row cursor of the sequencer: the last position handed out and the last
    transaction that got positions. An advisory lock keyed on this table's oid is the
    sequencers' mutex; writers never take it.
``lakefold.event_segments``
    Sealed segments: complete ranges of positions ``[first_position, end_position)`` stored as
    one compressed Arrow IPC file each (``data``), for bulk readers (see ``_segments.py``).
    A derived copy of the log, never its record: deleting a stream drops the segments that hold
    its events, and the sealer seals them again.
``lakefold.subscription_checkpoints``
    The durable checkpoint (last processed position) of each named subscription.

Server-side functions keep an append to one round trip: ``append_events`` checks and bumps the
stream versions (in stream-id order, so multi-stream appends cannot deadlock) and inserts the
events; ``sequence_events`` assigns positions. Errors that callers act on carry SQLSTATEs of our
own class ``LF``: ``LF001`` wrong expected version, ``LF002`` stream deleted, ``LF010`` the
sequencer was called inside a transaction, ``LF011`` a deletion outside READ COMMITTED. Their
``DETAIL`` is a JSON object.
"""

from __future__ import annotations

from typing import Final

import psycopg
from psycopg import sql

from lakefold.core import migrations
from lakefold.core.dsn import mask_dsn
from lakefold.core.migrations import Migration
from lakefold.eventstore.exceptions import EventStoreUnavailableError

SCHEMA: Final = "lakefold"
NOTIFY_CHANNEL: Final = "lakefold_events"
DELETED_EVENT_TYPE: Final = "$stream.deleted"
SQLSTATE_WRONG_EXPECTED_VERSION: Final = "LF001"
SQLSTATE_STREAM_DELETED: Final = "LF002"
SQLSTATE_SEQUENCER_IN_TRANSACTION: Final = "LF010"
#: The advisory lock between sealers (exclusive) and stream deletions (shared); see _segments.
SEAL_LOCK_KEY: Final = 0x6C66_7365_616C  # "lfseal"


_TABLES = """
CREATE SCHEMA IF NOT EXISTS lakefold;

CREATE TABLE IF NOT EXISTS lakefold.streams (
    stream_id   text PRIMARY KEY,
    category    text NOT NULL,
    version     bigint NOT NULL CHECK (version >= 0),
    deleted     text CHECK (deleted IN ('soft', 'hard')),
    deleted_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS lakefold.events (
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ordinal         integer NOT NULL CHECK (ordinal >= 0),
    event_id        uuid NOT NULL,
    stream_id       text NOT NULL,
    stream_version  bigint NOT NULL CHECK (stream_version >= 1),
    category        text NOT NULL,
    type            text NOT NULL,
    schema_version  integer NOT NULL CHECK (schema_version >= 1),
    data            json NOT NULL,
    metadata        jsonb NOT NULL DEFAULT '{}',
    correlation_id  uuid,
    causation_id    uuid,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    deleted         boolean NOT NULL DEFAULT false,
    CONSTRAINT events_pkey PRIMARY KEY (xid, ordinal),
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version)
);

CREATE TABLE IF NOT EXISTS lakefold.event_runs (
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    first_ordinal   integer NOT NULL CHECK (first_ordinal >= 0),
    last_ordinal    integer NOT NULL,
    category        text NOT NULL,
    type            text NOT NULL,
    deleted         boolean NOT NULL DEFAULT false,
    CHECK (last_ordinal >= first_ordinal)
);
CREATE INDEX IF NOT EXISTS event_runs_category_idx
    ON lakefold.event_runs (category, xid, first_ordinal);
CREATE INDEX IF NOT EXISTS event_runs_type_idx ON lakefold.event_runs (type, xid, first_ordinal);

CREATE TABLE IF NOT EXISTS lakefold.event_positions (
    first_position  bigint PRIMARY KEY CHECK (first_position >= 1),
    xid             xid8 NOT NULL,
    events          integer NOT NULL CHECK (events >= 1),
    CONSTRAINT event_positions_xid_key UNIQUE (xid)
);

CREATE TABLE IF NOT EXISTS lakefold.event_sequencer (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_position  bigint NOT NULL DEFAULT 0,
    last_xid       xid8 NOT NULL DEFAULT '0',
    sequenced_at   timestamptz
);
INSERT INTO lakefold.event_sequencer DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS lakefold.event_segments (
    first_position  bigint PRIMARY KEY CHECK (first_position >= 1),
    end_position    bigint NOT NULL,
    events          integer NOT NULL CHECK (events >= 0),
    data            bytea NOT NULL,
    sealed_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (end_position > first_position)
);
-- The data is compressed already: stored out of line as it is, never recompressed.
ALTER TABLE lakefold.event_segments ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE IF NOT EXISTS lakefold.subscription_checkpoints (
    name        text PRIMARY KEY,
    position    bigint NOT NULL CHECK (position >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""

# A store installed before ``event_runs`` indexed category and type per event: its runs are
# built from its events (islands of consecutive ordinals with one stream, type and deletion
# state) and the per-event indexes dropped, once, under the install lock.
_RUNS_MIGRATION = """
DO $mig$
BEGIN
    IF to_regclass('lakefold.events_category_idx') IS NOT NULL THEN
        INSERT INTO lakefold.event_runs (xid, first_ordinal, last_ordinal, category, type,
                                         deleted)
        SELECT g.xid, min(g.ordinal), max(g.ordinal), min(g.category), g.type, g.deleted
        FROM (SELECT e.xid, e.ordinal, e.stream_id, e.category, e.type, e.deleted,
                     e.ordinal - row_number() OVER (
                         PARTITION BY e.xid, e.stream_id, e.type, e.deleted ORDER BY e.ordinal
                     ) AS island
              FROM lakefold.events e) AS g
        GROUP BY g.xid, g.stream_id, g.type, g.deleted, g.island;
        DROP INDEX lakefold.events_category_idx;
        DROP INDEX IF EXISTS lakefold.events_type_idx;
    END IF;
END
$mig$;
"""

# The next ordinal of the current transaction, kept in a transaction-local setting: it resets
# when the transaction ends and rolls back with a savepoint, so ordinals are 0, 1, 2... over
# every event the transaction keeps.
_ORDINAL_FUNCTIONS = """
CREATE OR REPLACE FUNCTION lakefold.take_ordinals(p_count integer)
RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_next integer := coalesce(nullif(current_setting('lakefold.next_ordinal', true), ''),
                               '0')::integer;
BEGIN
    PERFORM set_config('lakefold.next_ordinal', (v_next + p_count)::text, true);
    RETURN v_next;
END
$fn$;
"""

# p_expected: NULL = any, -1 = no stream, -2 = stream exists, n >= 1 = exactly version n.
# Checks and bumps each stream's version (locking stream rows in stream-id order, so that
# concurrent multi-stream appends cannot deadlock); returns each stream's version before.
_RESERVE_FUNCTION = """
CREATE OR REPLACE FUNCTION lakefold.reserve_versions(
    p_stream_ids text[], p_categories text[], p_expected bigint[], p_counts integer[])
RETURNS bigint[]
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_prev     bigint[] := array_fill(0::bigint, ARRAY[cardinality(p_stream_ids)]);
    v_i        integer;
    v_version  bigint;
    v_actual   bigint;
    v_deleted  text;
BEGIN
    FOR v_i IN
        SELECT u.o FROM unnest(p_stream_ids) WITH ORDINALITY AS u(s, o) ORDER BY u.s COLLATE "C"
    LOOP
        v_version := NULL;
        IF p_expected[v_i] IS NULL THEN
            INSERT INTO lakefold.streams AS st (stream_id, category, version)
            VALUES (p_stream_ids[v_i], p_categories[v_i], p_counts[v_i])
            ON CONFLICT (stream_id) DO UPDATE
                SET version = st.version + p_counts[v_i], updated_at = now()
                WHERE st.deleted IS NULL
            RETURNING st.version - p_counts[v_i] INTO v_version;
        ELSIF p_expected[v_i] = -1 THEN
            INSERT INTO lakefold.streams (stream_id, category, version)
            VALUES (p_stream_ids[v_i], p_categories[v_i], p_counts[v_i])
            ON CONFLICT (stream_id) DO NOTHING
            RETURNING 0 INTO v_version;
        ELSIF p_expected[v_i] = -2 THEN
            UPDATE lakefold.streams
            SET version = version + p_counts[v_i], updated_at = now()
            WHERE stream_id = p_stream_ids[v_i] AND deleted IS NULL
            RETURNING version - p_counts[v_i] INTO v_version;
        ELSE
            UPDATE lakefold.streams
            SET version = version + p_counts[v_i], updated_at = now()
            WHERE stream_id = p_stream_ids[v_i] AND version = p_expected[v_i]
              AND deleted IS NULL
            RETURNING p_expected[v_i] INTO v_version;
        END IF;
        IF v_version IS NULL THEN
            SELECT s.version, s.deleted INTO v_actual, v_deleted
            FROM lakefold.streams s WHERE s.stream_id = p_stream_ids[v_i];
            IF v_deleted IS NOT NULL THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'LF002',
                    MESSAGE = format('stream %s is deleted (%s)', p_stream_ids[v_i], v_deleted),
                    DETAIL = json_build_object('stream_id', p_stream_ids[v_i],
                                               'deleted', v_deleted)::text;
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'LF001',
                MESSAGE = format('wrong expected version for stream %s', p_stream_ids[v_i]),
                DETAIL = json_build_object('stream_id', p_stream_ids[v_i],
                                           'expected', p_expected[v_i],
                                           'actual', v_actual)::text;
        END IF;
        v_prev[v_i] := v_version;
    END LOOP;
    RETURN v_prev;
END
$fn$;
"""

# The events come as parallel arrays in append order: p_stream_index is the 1-based index of
# each event's stream in the stream arrays; p_data holds JSON texts, p_metadata JSON texts or
# NULL for {}. Arrays arrive in binary and need no parsing but the payload's own. Returns each
# stream's version before the append. (Large appends use reserve_versions, take_ordinals and
# COPY instead: see _copy.py.)
_APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION lakefold.append_events(
    p_stream_ids text[], p_categories text[], p_expected bigint[], p_counts integer[],
    p_event_ids uuid[], p_stream_index integer[], p_types text[], p_versions integer[],
    p_data text[], p_metadata text[], p_correlation uuid[], p_causation uuid[])
RETURNS bigint[]
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_prev   bigint[] := lakefold.reserve_versions(p_stream_ids, p_categories, p_expected,
                                                   p_counts);
    v_first  integer := lakefold.take_ordinals(cardinality(p_event_ids));
BEGIN
    INSERT INTO lakefold.events (ordinal, event_id, stream_id, stream_version, category, type,
                                 schema_version, data, metadata, correlation_id, causation_id)
    SELECT v_first + x.o - 1, x.i, p_stream_ids[x.k],
           v_prev[x.k] + row_number() OVER (PARTITION BY x.k ORDER BY x.o),
           p_categories[x.k], x.t, x.v, x.d::json, COALESCE(x.m::jsonb, '{}'::jsonb), x.c, x.z
    FROM unnest(p_event_ids, p_stream_index, p_types, p_versions, p_data, p_metadata,
                p_correlation, p_causation) WITH ORDINALITY AS x(i, k, t, v, d, m, c, z, o)
    ORDER BY x.o;
    INSERT INTO lakefold.event_runs (first_ordinal, last_ordinal, category, type)
    SELECT v_first + min(g.o) - 1, v_first + max(g.o) - 1, p_categories[g.k], g.t
    FROM (SELECT x.k, x.t, x.o,
                 x.o - row_number() OVER (PARTITION BY x.k, x.t ORDER BY x.o) AS island
          FROM unnest(p_stream_index, p_types) WITH ORDINALITY AS x(k, t, o)) AS g
    GROUP BY g.k, g.t, g.island;
    RETURN v_prev;
END
$fn$;
"""

# Deletes a stream, soft (events hidden, kept) or hard (events erased), and appends the
# deletion record that readers and projections receive. Returns the record's stream version.
_DELETE_FUNCTION = """
CREATE OR REPLACE FUNCTION lakefold.delete_stream(
    p_stream_id text, p_expected bigint, p_hard boolean, p_event_id uuid)
RETURNS bigint
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_version   bigint;
    v_deleted   text;
    v_category  text;
    v_ordinal   integer;
BEGIN
    -- Inside a longer REPEATABLE READ transaction the segment drop below could miss a segment
    -- sealed after that transaction's snapshot (see _segments.py).
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF011',
            MESSAGE = 'lakefold.delete_stream() must run in a READ COMMITTED transaction',
            HINT = 'use EventStore.delete_stream(), or the default isolation level';
    END IF;
    -- Shared with other deletions, exclusive against a sealer: no segment is sealed while a
    -- deletion is under way, and the segments sealed before are visible to the drop below.
    PERFORM pg_advisory_xact_lock_shared({seal_lock});
    SELECT s.version, s.deleted, s.category INTO v_version, v_deleted, v_category
    FROM lakefold.streams s WHERE s.stream_id = p_stream_id FOR UPDATE;
    IF v_deleted = 'hard' OR (v_deleted = 'soft' AND NOT p_hard) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF002',
            MESSAGE = format('stream %s is already deleted (%s)', p_stream_id, v_deleted),
            DETAIL = json_build_object('stream_id', p_stream_id, 'deleted', v_deleted)::text;
    END IF;
    IF v_version IS NULL
       OR (p_expected = -1)
       OR (p_expected >= 0 AND p_expected <> v_version) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF001',
            MESSAGE = format('wrong expected version for stream %s', p_stream_id),
            DETAIL = json_build_object('stream_id', p_stream_id, 'expected', p_expected,
                                       'actual', v_version)::text;
    END IF;
    -- The segments holding its visible events are dropped (a sealer seals them again
    -- without those events).
    DELETE FROM lakefold.event_segments s
    USING (SELECT b.first_position + e.ordinal AS position
           FROM lakefold.events e JOIN lakefold.event_positions b ON b.xid = e.xid
           WHERE e.stream_id = p_stream_id AND NOT e.deleted) AS p
    WHERE s.first_position = (SELECT max(g.first_position) FROM lakefold.event_segments g
                              WHERE g.first_position <= p.position)
      AND s.end_position > p.position;
    -- The stream's runs (each holds events of this stream only), found from its events
    -- through the category index, go with its events.
    IF p_hard THEN
        DELETE FROM lakefold.event_runs r USING lakefold.events e
        WHERE e.stream_id = p_stream_id AND r.category = v_category AND r.xid = e.xid
          AND r.first_ordinal <= e.ordinal AND r.last_ordinal >= e.ordinal;
        DELETE FROM lakefold.events e WHERE e.stream_id = p_stream_id;
    ELSE
        UPDATE lakefold.event_runs r SET deleted = true FROM lakefold.events e
        WHERE e.stream_id = p_stream_id AND r.category = v_category AND r.xid = e.xid
          AND r.first_ordinal <= e.ordinal AND r.last_ordinal >= e.ordinal AND NOT r.deleted;
        UPDATE lakefold.events e SET deleted = true
        WHERE e.stream_id = p_stream_id AND NOT e.deleted;
    END IF;
    UPDATE lakefold.streams
    SET version = v_version + 1, deleted = CASE WHEN p_hard THEN 'hard' ELSE 'soft' END,
        deleted_at = now(), updated_at = now()
    WHERE stream_id = p_stream_id;
    v_ordinal := lakefold.take_ordinals(1);
    INSERT INTO lakefold.event_runs (first_ordinal, last_ordinal, category, type)
    VALUES (v_ordinal, v_ordinal, v_category, '$stream.deleted');
    INSERT INTO lakefold.events (ordinal, event_id, stream_id, stream_version, category, type,
                                 schema_version, data)
    VALUES (v_ordinal, p_event_id, p_stream_id, v_version + 1, v_category,
            '$stream.deleted', 1,
            json_build_object('stream_id', p_stream_id,
                              'mode', CASE WHEN p_hard THEN 'hard' ELSE 'soft' END,
                              'last_version', v_version));
    RETURN v_version + 1;
END
$fn$;
"""

_SEQUENCE_FUNCTION = """
CREATE OR REPLACE FUNCTION lakefold.sequence_events(p_limit bigint)
RETURNS TABLE (o_head bigint, o_pending boolean, o_transactions bigint)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_watermark  xid8;
    v_last       bigint;
    v_xid        xid8;
    v_n          bigint;
    v_new_last   bigint;
    v_new_xid    xid8;
BEGIN
    -- Own transaction only: inside a longer one the mutex would be held, and the watermark
    -- pinned, until that transaction ends (this catches the transactions that wrote).
    IF pg_current_xact_id_if_assigned() IS NOT NULL
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF010',
            MESSAGE = 'lakefold.sequence_events() must run in its own READ COMMITTED '
                      'transaction',
            HINT = 'call it on an autocommit connection';
    END IF;
    -- 1. The sequencers' mutex: a transaction-level advisory lock, which gives this
    --    transaction no xid. Writers never take it. Once we hold it, no other sequencer is
    --    running, so none holds the watermark back (a running sequencer has an xid).
    PERFORM pg_advisory_xact_lock('lakefold.event_sequencer'::regclass::oid::bigint);
    -- 2. The watermark, from a snapshot taken now, before we have an xid of our own: every
    --    transaction with an xid below it has finished, committed or not. The cursor, read
    --    after the lock, includes the previous sequencer's work.
    v_watermark := pg_snapshot_xmin(pg_current_snapshot());
    SELECT q.last_position, q.last_xid INTO v_last, v_xid FROM lakefold.event_sequencer q;
    -- "Is anything after v_xid?" is asked as max(xid) > v_xid, never as EXISTS (... xid >
    -- v_xid): PL/pgSQL soon plans with a generic plan, which for a one-sided range expects a
    -- third of the table and picks a sequential scan, and when nothing matches (the usual
    -- answer) that scan reads every event, at every round. max() reads one index entry.
    IF NOT EXISTS (SELECT 1 FROM lakefold.events e
                   WHERE e.xid > v_xid AND e.xid < v_watermark) THEN
        RETURN QUERY SELECT v_last,
            coalesce((SELECT max(e.xid) FROM lakefold.events e) > v_xid, false), 0::bigint;
        RETURN;  -- nothing to do: no xid, nothing written
    END IF;
    -- 3. Give every final transaction after the cursor, in xid order, the next run of
    --    positions: one per ordinal it used (an event erased before this leaves a hole).
    WITH t AS (
        SELECT e.xid, max(e.ordinal) + 1 AS n
        FROM lakefold.events e
        WHERE e.xid > v_xid AND e.xid < v_watermark
        GROUP BY e.xid ORDER BY e.xid LIMIT p_limit
    ), b AS (
        INSERT INTO lakefold.event_positions (first_position, xid, events)
        SELECT v_last + 1 + coalesce(sum(t.n) OVER (ORDER BY t.xid ROWS BETWEEN UNBOUNDED
                                                    PRECEDING AND 1 PRECEDING), 0),
               t.xid, t.n
        FROM t
        RETURNING first_position + events - 1 AS last_position, xid
    )
    SELECT count(*), max(b.last_position), max(b.xid) INTO v_n, v_new_last, v_new_xid FROM b;
    UPDATE lakefold.event_sequencer
    SET last_position = v_new_last, last_xid = v_new_xid, sequenced_at = now();
    -- Wake subscribers. Only sequencers notify: NOTIFY serialises committing transactions on
    -- a global lock, which must never be on the writers' path.
    PERFORM pg_notify('lakefold_events', v_new_last::text);
    RETURN QUERY SELECT v_new_last,
        coalesce((SELECT max(e.xid) FROM lakefold.events e) > v_new_xid, false), v_n;
END
$fn$;
"""

STATEMENTS: Final = (
    sql.SQL(_TABLES), sql.SQL(_RUNS_MIGRATION), sql.SQL(_ORDINAL_FUNCTIONS),
    sql.SQL(_RESERVE_FUNCTION), sql.SQL(_APPEND_FUNCTION),
    sql.SQL(_DELETE_FUNCTION).format(seal_lock=sql.Literal(SEAL_LOCK_KEY)),
    sql.SQL(_SEQUENCE_FUNCTION),
)

#: The event store's tables and functions (``lakefold.core.migrations``). A change to a
#: function is a new version that replaces it (``CREATE OR REPLACE``), never an edit here.
COMPONENT: Final = migrations.register(
    "event_store", Migration(1, "streams, events, runs, positions, sequencer, functions",
                             *STATEMENTS),
    # a store indexed per event (before runs) is moved to runs by running version 1 again
    expect="to_regclass('lakefold.events_category_idx') IS NULL")


def install(dsn: str) -> None:
    """Create schema ``lakefold`` with the event store's tables and functions (migrates
    component ``event_store``); idempotent and safe to run from several processes at once.
    Raises EventStoreUnavailableError when the server cannot be reached."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrations.migrate(conn, COMPONENT)
    except psycopg.OperationalError as e:
        reason = " ".join(str(e).split())
        raise EventStoreUnavailableError(
            f"cannot install the event store at {mask_dsn(dsn)}: {reason}; check that the "
            "server is running and the DSN is right"
        ) from e
