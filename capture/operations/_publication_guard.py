"""The publication guard: an event trigger in the source database that keeps each lakefold
publication equal to the publishable tables of its capture's scope (``_publishable``) within
the very transaction of the DDL that changes them.

Why an event trigger: a table created without a key, or a captured table whose key is dropped,
must leave the publication *before* the application's next UPDATE or DELETE on it, which
PostgreSQL would otherwise refuse; and a table that gains a key should be captured without
waiting for anyone. Only DDL changes publishability, and event triggers run inside the DDL's
transaction, so the publication changes atomically with the table.

What is installed (schema ``lakefold`` of the source, which lakefold never captures):

* ``lakefold.capture_publications``: per publication, the scope (a schema, or listed tables);
* ``lakefold.capture_candidates(...)``: ``_publishable.CANDIDATES_SQL`` as a SQL function;
* ``lakefold.capture_reconcile(pub, touched)``: drops tables that stopped being publishable
  (``RAISE WARNING`` to the user's session naming the table and the fix), adds tables that
  became publishable, and writes a transactional ``lakefold.publication`` message naming
  them so the capture learns it in stream order (a joining table is re-snapshotted);
* ``lakefold.capture_guard()``: the SECURITY DEFINER trigger function (``search_path =
  pg_catalog, pg_temp``), on ``ddl_command_end`` for the statements that create or alter
  tables, on ``sql_drop`` for every drop (``DROP INDEX``, ``DROP TYPE ... CASCADE`` dropping
  a key column ...), and on ``ddl_command_start`` of ``ALTER TABLE`` (see parking below).

It never raises: every failure becomes a WARNING (``EXCEPTION WHEN OTHERS``), since a capture
tool must not make the user's DDL fail either. It ignores ``ALTER PUBLICATION`` (its own
statements fire the trigger again), other databases (event triggers are per database), other
schemas and other captures (each publication has its own scope row; a row whose publication
is gone is ignored).

Subtleties:

* Leaving and rejoining within one transaction (``BEGIN; DROP CONSTRAINT pk; ADD PRIMARY KEY
  (a, b); COMMIT``) needs no snapshot when the table did not change while out: a
  transaction-local setting (``lakefold.out``) keeps a fingerprint of a table that left (its
  relfilenodes and this transaction's insert/update/delete counts, ``pg_stat_xact_*``); when
  it rejoins with the same fingerprint it is reported as ``rejoined``, otherwise as ``added``
  (its rows changed while PostgreSQL did not publish them, so it is re-snapshotted). Other
  transactions cannot write it meanwhile: the DDL holds an ACCESS EXCLUSIVE lock on it.
* Parking: PostgreSQL refuses ``ALTER TABLE ... SET UNLOGGED`` on a table that is in a
  publication by name. At ``ddl_command_start`` of an ``ALTER TABLE`` whose text mentions
  UNLOGGED, members whose name occurs in the text leave the publication; at
  ``ddl_command_end`` they rejoin unless they are unlogged now.
* Adding a table waits at most 200 ms for the publication's lock (held by another
  transaction that changes it); the running capture adds it later (``_control``). Removing
  waits like any DDL, because a table that stays published without identity breaks the
  application's UPDATE and DELETE.

Creating event triggers needs a superuser (as ``FOR TABLES IN SCHEMA`` publications did).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg
from psycopg import errors, sql

from lakefold.capture.decoding._publishable import (
    CANDIDATES_SQL,
    MESSAGE_PREFIX,
    Scope,
    TableState,
    candidates,
    unsafe_members,
)

log = logging.getLogger(__name__)

_INSTALL_LOCK: Final = 0x6C616B65_67756172  # "lakeguar"
TRIGGERS: Final = ("lakefold_capture_guard_start", "lakefold_capture_guard_end",
                   "lakefold_capture_guard_drop")
_FUNCTIONS: Final = ("capture_guard()", "capture_reconcile(text, oid[])", "capture_park(text)",
                     "capture_fingerprint(oid)", "capture_candidates(text, text[], text[])")

# The tags after which a table's publishability may have changed (drops: sql_drop, any tag).
_END_TAGS: Final = ("CREATE TABLE", "CREATE TABLE AS", "SELECT INTO", "ALTER TABLE",
                    "ALTER INDEX", "ALTER SCHEMA", "CREATE EXTENSION", "ALTER EXTENSION")

_OBJECTS: Final = """
CREATE TABLE IF NOT EXISTS lakefold.capture_publications (
    publication text PRIMARY KEY,
    schema_name text,
    table_schemas text[] NOT NULL DEFAULT '{}',
    table_names text[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON lakefold.capture_publications FROM PUBLIC;
GRANT SELECT ON lakefold.capture_publications TO PUBLIC;

DROP FUNCTION IF EXISTS lakefold.capture_candidates(text, text[], text[]);
CREATE FUNCTION lakefold.capture_candidates(text, text[], text[])
RETURNS TABLE (relid bigint, schema_name text, table_name text, refused boolean, reason text,
               fix text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $lakefold$ @CANDIDATES@ $lakefold$;

-- A table's storage and this transaction's row changes to it (all its partitions): equal
-- fingerprints mean this transaction did not change its rows in between.
CREATE OR REPLACE FUNCTION lakefold.capture_fingerprint(oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $lakefold$
SELECT string_agg(format('%s:%s:%s:%s:%s', c.oid, c.relfilenode, coalesce(s.n_tup_ins, 0),
                         coalesce(s.n_tup_upd, 0), coalesce(s.n_tup_del, 0)), ','
                  ORDER BY c.oid)
FROM pg_catalog.pg_class c
LEFT JOIN pg_catalog.pg_stat_xact_all_tables s ON s.relid = c.oid
WHERE c.oid = $1 OR c.oid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree($1) t)
$lakefold$;

CREATE OR REPLACE FUNCTION lakefold.capture_reconcile(pub text, touched oid[])
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $lakefold$
DECLARE
    scope lakefold.capture_publications;
    r record;
    was_out jsonb := coalesce(nullif(current_setting('lakefold.out', true), ''), '{}')::jsonb;
    added jsonb := '[]';
    rejoined jsonb := '[]';
    removed jsonb := '[]';
    excluded jsonb := '[]';
    entry jsonb;
    saved_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT * INTO scope FROM lakefold.capture_publications WHERE publication = pub;
    IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = pub) THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT coalesce(c.relid, m.relid) AS relid,
               coalesce(c.schema_name, m.schema_name) AS schema_name,
               coalesce(c.table_name, m.table_name) AS table_name,
               CASE WHEN c.relid IS NULL THEN 'it is no longer in the capture''s scope'
                    ELSE c.reason END AS reason,
               c.fix, m.relid IS NOT NULL AS member
        FROM lakefold.capture_candidates(scope.schema_name, scope.table_schemas,
                                         scope.table_names) c
        FULL JOIN (SELECT pr.prrelid::bigint AS relid, n.nspname::text AS schema_name,
                          cl.relname::text AS table_name
                   FROM pg_publication_rel pr
                   JOIN pg_publication p ON p.oid = pr.prpubid
                   JOIN pg_class cl ON cl.oid = pr.prrelid
                   JOIN pg_namespace n ON n.oid = cl.relnamespace
                   WHERE p.pubname = pub) m ON m.relid = c.relid
    LOOP
        entry := jsonb_build_array(r.relid, r.schema_name, r.table_name, r.reason, r.fix);
        IF r.member AND r.reason IS NOT NULL THEN
            BEGIN
                was_out := was_out || jsonb_build_object(r.relid::text, jsonb_build_object(
                    'fp', lakefold.capture_fingerprint(r.relid::oid)));
                EXECUTE format('ALTER PUBLICATION %I DROP TABLE ONLY %I.%I', pub, r.schema_name,
                               r.table_name);
                removed := removed || jsonb_build_array(entry);
                RAISE WARNING 'lakefold: table %.% is no longer captured (it left publication '
                              '%): %',
                    quote_ident(r.schema_name), quote_ident(r.table_name), pub, r.reason
                    USING HINT = coalesce('Fix: ' || r.fix || '; lakefold then captures it '
                                          'again from a fresh snapshot.', 'Its stream keeps '
                                          'what was captured.');
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'lakefold: could not take table %.% out of publication % (%): '
                              'UPDATE and DELETE on it fail until it is out',
                    quote_ident(r.schema_name), quote_ident(r.table_name), pub, SQLERRM
                    USING HINT = format('The running capture retries within seconds; or run '
                                        'ALTER PUBLICATION %I DROP TABLE ONLY %I.%I', pub,
                                        r.schema_name, r.table_name);
            END;
        ELSIF NOT r.member AND r.reason IS NULL THEN
            BEGIN
                PERFORM set_config('lock_timeout', '200ms', true);
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE ONLY %I.%I', pub, r.schema_name,
                               r.table_name);
                PERFORM set_config('lock_timeout', saved_timeout, true);
                IF was_out -> r.relid::text ->> 'fp'
                        = lakefold.capture_fingerprint(r.relid::oid) THEN
                    rejoined := rejoined || jsonb_build_array(entry);
                ELSE
                    added := added || jsonb_build_array(entry);
                END IF;
                was_out := was_out - r.relid::text;
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'lakefold: table %.% is publishable but not yet in publication % '
                              '(%); the running capture adds it within seconds',
                    quote_ident(r.schema_name), quote_ident(r.table_name), pub, SQLERRM;
            END;
        ELSIF NOT r.member AND (was_out -> r.relid::text ->> 'parked') IS NOT NULL THEN
            removed := removed || jsonb_build_array(entry);
            was_out := was_out || jsonb_build_object(r.relid::text, jsonb_build_object(
                'fp', was_out -> r.relid::text ->> 'fp'));
            RAISE WARNING 'lakefold: table %.% is no longer captured (it left publication %): %',
                quote_ident(r.schema_name), quote_ident(r.table_name), pub, r.reason
                USING HINT = 'Fix: ' || r.fix || '; lakefold then captures it again from a '
                             'fresh snapshot.';
        ELSIF NOT r.member AND r.relid::oid = ANY (touched) AND NOT was_out ? r.relid::text THEN
            -- (a table that left earlier in this transaction was warned about then)
            excluded := excluded || jsonb_build_array(entry);
            RAISE WARNING 'lakefold: table %.% is not captured (left out of publication %): %',
                quote_ident(r.schema_name), quote_ident(r.table_name), pub, r.reason
                USING HINT = 'Fix: ' || r.fix || '; lakefold then captures it from a fresh '
                             'snapshot.';
        END IF;
    END LOOP;
    PERFORM set_config('lakefold.out', was_out::text, true);
    IF added <> '[]' OR rejoined <> '[]' OR removed <> '[]' OR excluded <> '[]' THEN
        BEGIN
            PERFORM pg_logical_emit_message(true, '@PREFIX@', jsonb_build_object(
                'publication', pub, 'added', added, 'rejoined', rejoined, 'removed', removed,
                'excluded', excluded)::text);
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'lakefold: could not tell the capture of publication % about this '
                          'change (%)', pub, SQLERRM;
        END;
    END IF;
END
$lakefold$;

-- PostgreSQL refuses ALTER TABLE ... SET UNLOGGED on a table that is in a publication by
-- name: members the statement may name leave the publication first; capture_reconcile puts
-- them back at the statement's end unless they are unlogged then.
CREATE OR REPLACE FUNCTION lakefold.capture_park(pub text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $lakefold$
DECLARE
    r record;
    query text := lower(current_query());
    was_out jsonb := coalesce(nullif(current_setting('lakefold.out', true), ''), '{}')::jsonb;
BEGIN
    IF position('unlogged' IN query) = 0 THEN
        RETURN;
    END IF;
    FOR r IN SELECT pr.prrelid, n.nspname, c.relname FROM pg_publication_rel pr
             JOIN pg_publication p ON p.oid = pr.prpubid
             JOIN pg_class c ON c.oid = pr.prrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE p.pubname = pub AND position(lower(c.relname) IN query) > 0 LOOP
        was_out := was_out || jsonb_build_object(r.prrelid::text, jsonb_build_object(
            'fp', lakefold.capture_fingerprint(r.prrelid), 'parked', true));
        EXECUTE format('ALTER PUBLICATION %I DROP TABLE ONLY %I.%I', pub, r.nspname, r.relname);
    END LOOP;
    PERFORM set_config('lakefold.out', was_out::text, true);
END
$lakefold$;

CREATE OR REPLACE FUNCTION lakefold.capture_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $lakefold$
DECLARE
    pub text;
    touched oid[] := '{}';
BEGIN
    IF tg_tag = 'ALTER PUBLICATION' THEN
        RETURN;  -- the guard's own statements fire this trigger again
    END IF;
    IF tg_event = 'ddl_command_end' THEN
        SELECT coalesce(array_agg(DISTINCT coalesce(i.indrelid, d.objid)), '{}') INTO touched
        FROM pg_event_trigger_ddl_commands() d
        LEFT JOIN pg_index i ON i.indexrelid = d.objid
        WHERE d.classid = 'pg_catalog.pg_class'::regclass;
        touched := touched || ARRAY(SELECT pg_partition_root(t)::oid FROM unnest(touched) t
                                    WHERE pg_partition_root(t) IS NOT NULL);
        -- Temporary tables are never captured, and applications create them often: their
        -- DDL costs no reconciliation (statements without a table in them still do).
        IF touched <> '{}' AND NOT EXISTS (SELECT 1 FROM pg_class c
                                           WHERE c.oid = ANY (touched)
                                             AND c.relpersistence <> 't') THEN
            RETURN;
        END IF;
    ELSIF tg_event = 'sql_drop' THEN
        IF NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d
                       WHERE NOT d.is_temporary) THEN
            RETURN;
        END IF;
    END IF;
    FOR pub IN SELECT publication FROM lakefold.capture_publications ORDER BY 1 LOOP
        BEGIN
            IF tg_event = 'ddl_command_start' THEN
                PERFORM lakefold.capture_park(pub);
            ELSE
                PERFORM lakefold.capture_reconcile(pub, touched);
            END IF;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'lakefold: could not keep publication % in step with this statement '
                          '(%)', pub, SQLERRM
                USING HINT = 'The statement itself is not affected; `lakefold capture status` '
                             'shows what is captured.';
        END;
    END LOOP;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'lakefold: the publication guard failed (%)', SQLERRM
        USING HINT = 'The statement itself is not affected; `lakefold capture status` shows '
                     'what is captured.';
END
$lakefold$;
REVOKE ALL ON FUNCTION lakefold.capture_reconcile(text, oid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION lakefold.capture_park(text) FROM PUBLIC;

DROP EVENT TRIGGER IF EXISTS lakefold_capture_guard_start;
DROP EVENT TRIGGER IF EXISTS lakefold_capture_guard_end;
DROP EVENT TRIGGER IF EXISTS lakefold_capture_guard_drop;
CREATE EVENT TRIGGER lakefold_capture_guard_start ON ddl_command_start
    WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION lakefold.capture_guard();
CREATE EVENT TRIGGER lakefold_capture_guard_end ON ddl_command_end
    WHEN TAG IN (@END_TAGS@) EXECUTE FUNCTION lakefold.capture_guard();
CREATE EVENT TRIGGER lakefold_capture_guard_drop ON sql_drop
    EXECUTE FUNCTION lakefold.capture_guard();
ALTER EVENT TRIGGER lakefold_capture_guard_start ENABLE ALWAYS;
ALTER EVENT TRIGGER lakefold_capture_guard_end ENABLE ALWAYS;
ALTER EVENT TRIGGER lakefold_capture_guard_drop ENABLE ALWAYS;
"""


def _objects_sql() -> str:
    tags = ", ".join(f"'{tag}'" for tag in _END_TAGS)
    return (_OBJECTS.replace("@CANDIDATES@", CANDIDATES_SQL).replace("@PREFIX@", MESSAGE_PREFIX)
            .replace("@END_TAGS@", tags))


def can_install(conn: psycopg.Connection[Any]) -> bool:
    """True when the connected role may create event triggers (a superuser)."""
    row = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles "
                       "WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def install(conn: psycopg.Connection[Any], publication: str, scope: Scope) -> None:
    """Install (or update) the guard's objects and record ``publication``'s scope, in the
    caller's transaction (``conn`` must be inside one). Needs a superuser."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INSTALL_LOCK,))
    conn.execute("CREATE SCHEMA IF NOT EXISTS lakefold")
    conn.execute(_objects_sql().encode())
    schemas, names = scope.params()[1:]
    conn.execute(
        "INSERT INTO lakefold.capture_publications (publication, schema_name, table_schemas, "
        "table_names) VALUES (%s, %s, %s, %s) ON CONFLICT (publication) DO UPDATE SET "
        "schema_name = EXCLUDED.schema_name, table_schemas = EXCLUDED.table_schemas, "
        "table_names = EXCLUDED.table_names, updated_at = now()",
        (publication, scope.schema, schemas, names))


def is_installed(conn: psycopg.Connection[Any], publication: str) -> bool:
    """True when the guard's triggers are enabled and watch ``publication``."""
    row = conn.execute(
        "SELECT count(*) = %s FROM pg_catalog.pg_event_trigger WHERE evtname = ANY(%s) "
        "AND evtenabled <> 'D'", (len(TRIGGERS), list(TRIGGERS))).fetchone()
    if not row or not row[0]:
        return False
    if conn.execute("SELECT to_regclass('lakefold.capture_publications')").fetchone() == (None,):
        return False
    try:
        with conn.transaction():
            found = conn.execute("SELECT 1 FROM lakefold.capture_publications "
                                 "WHERE publication = %s", (publication,)).fetchone()
    except errors.InsufficientPrivilege:
        return True  # an older install without the SELECT grant: the triggers exist
    return found is not None


def uninstall(conn: psycopg.Connection[Any], publication: str) -> None:
    """Stop guarding ``publication``; when no publication is left, drop the triggers,
    functions and table (and schema ``lakefold`` of the source if it is then empty). A role
    that may not do so gets a warning in the log; the leftover row is inert (its
    publication is gone)."""
    if conn.execute("SELECT to_regclass('lakefold.capture_publications')").fetchone() == (None,):
        return
    if conn.execute("SELECT 1 FROM lakefold.capture_publications WHERE publication = %s",
                    (publication,)).fetchone() is None:
        return  # not guarded (a capture without a superuser): nothing of ours to remove
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INSTALL_LOCK,))
            conn.execute("DELETE FROM lakefold.capture_publications WHERE publication = %s",
                          (publication,))
            left = conn.execute("SELECT count(*) FROM lakefold.capture_publications").fetchone()
            if left and left[0]:
                return
            for trigger in TRIGGERS:
                conn.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(
                    sql.Identifier(trigger)))
            for function in _FUNCTIONS:
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS lakefold.{}").format(
                    sql.SQL(function)))
            conn.execute("DROP TABLE lakefold.capture_publications")
    except errors.InsufficientPrivilege as e:
        log.warning("could not remove the publication guard (event trigger) of publication %r "
                    "from the source: %s; it is inert without the publication. Run `lakefold "
                    "capture drop` as a superuser to remove it", publication,
                    e.diag.message_primary)
        return
    try:
        with conn.transaction():
            conn.execute("DROP SCHEMA IF EXISTS lakefold")
    except (errors.DependentObjectsStillExist, errors.InsufficientPrivilege):
        pass  # the store (or something else of lakefold's) lives there


def report(conn: psycopg.Connection[Any], publication: str,
           scope: Scope | None) -> tuple[list[TableState], list[TableState], bool]:
    """For ``capture status``: (tables of ``scope`` left out of ``publication``, with reason
    and fix; tables in the publication whose UPDATE and DELETE PostgreSQL refuses right now;
    whether the guard watches the publication)."""
    excluded = [] if scope is None else [
        s for s in candidates(conn, scope) if s.reason is not None]
    return excluded, unsafe_members(conn, publication), is_installed(conn, publication)
