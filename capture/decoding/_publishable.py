"""Which tables a capture may publish, and keeping its publication exactly that set.

PostgreSQL refuses ``UPDATE`` and ``DELETE`` on a table that a publication publishes updates
and deletes for when the table has no replica identity ("cannot update table ... because it
does not have a replica identity and publishes updates"). That error hits the application, not
lakefold, so lakefold publishes a table only while PostgreSQL can never refuse such a
statement on it. A table is *publishable* when:

* its replica identity works: ``FULL``; or ``DEFAULT`` with a usable primary key; or ``USING
  INDEX`` with a usable index. Usable means what PostgreSQL's relcache accepts as identity
  (``RelationGetIndexList``): valid, unique, immediate, without predicate. A ``DEFERRABLE``
  primary key is *not* an identity (UPDATE fails under ``DEFAULT``), and ``USING INDEX``
  whose index was dropped behaves like ``NOTHING``. Verified on PostgreSQL 15 and 18.
* for a partitioned table (published via its root), every leaf partition satisfies the above:
  PostgreSQL checks the partition a row is in, not the root.
* it is a permanent table: PostgreSQL cannot publish ``UNLOGGED`` tables.
* it has a primary key or a replica identity index: records are keyed by it and snapshots
  copy rows in its order. (A ``FULL`` table without a key is safe for the application, but
  cannot be snapshotted, so it waits for a key too.)

The capture's *scope* is a schema (its tables, partitions via their root) or a list of
``schema.table`` names. ``reconcile`` makes the publication's tables equal the publishable
tables of the scope, in one transaction, and writes a transactional logical decoding message
(prefix ``lakefold.publication``) naming the tables that joined or left, so that the capture
learns it in stream order (``_inband_messages``): a table that joins is re-snapshotted, one that
leaves keeps its stream as it was. The event trigger (``_publication_guard``) does the same within
the user's DDL transaction, with the same classification (``CANDIDATES_SQL``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

MESSAGE_PREFIX: Final = "lakefold.publication"

#: The scope's tables with why each is not publishable (NULL when it is) and the fix. $1 is
#: the scope's schema (or NULL), $2 and $3 the schemas and names of its listed tables. Used
#: as the body of ``lakefold.capture_candidates`` in the source (``_publication_guard``) and
#: run as is.
CANDIDATES_SQL: Final = """
WITH scope AS (
    SELECT c.oid AS relid, n.nspname::text AS schema_name, c.relname::text AS table_name,
           c.relkind, c.relpersistence, format('%I.%I', n.nspname, c.relname) AS qualified
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'lakefold'
      AND ((n.nspname = $1 AND NOT c.relispartition)
           OR (n.nspname, c.relname) IN (
               SELECT u.s, u.t FROM unnest($2::text[], $3::text[]) AS u(s, t)))
), leaf AS (
    SELECT s.relid, l.relreplident, format('%I.%I', ln.nspname, l.relname) AS leaf_name,
           EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = l.oid
                   AND i.indisvalid AND i.indisunique AND i.indimmediate
                   AND i.indpred IS NULL
                   AND CASE l.relreplident WHEN 'd' THEN i.indisprimary
                                           ELSE i.indisreplident END) AS has_identity,
           EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = l.oid
                   AND i.indisprimary) AS has_primary_key
    FROM scope s
    JOIN pg_catalog.pg_class l ON l.oid = s.relid AND s.relkind = 'r'
                               OR l.oid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree(
                                                s.relid) t WHERE t.isleaf)
                                  AND s.relkind = 'p' AND l.relkind = 'r'
    JOIN pg_catalog.pg_namespace ln ON ln.oid = l.relnamespace
), broken AS (
    SELECT DISTINCT ON (relid) * FROM leaf
    WHERE relreplident <> 'f' AND NOT has_identity
    ORDER BY relid, leaf_name
), judged AS (
    SELECT s.relid, s.schema_name, s.table_name, s.qualified, b.leaf_name,
           CASE WHEN b.leaf_name = s.qualified THEN 'it'
                ELSE 'its partition ' || b.leaf_name END AS subject,
           CASE
               WHEN s.relpersistence <> 'p' THEN 'unlogged'
               WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                WHERE i.indrelid = s.relid
                                AND (i.indisprimary OR i.indisreplident)) THEN 'no key'
               WHEN b.relid IS NULL THEN NULL
               WHEN b.relreplident = 'n' THEN 'nothing'
               WHEN b.relreplident = 'i' THEN 'index gone'
               WHEN b.has_primary_key THEN 'deferrable'
               ELSE 'leaf without key'
           END AS problem
    FROM scope s LEFT JOIN broken b ON b.relid = s.relid
)
SELECT relid::bigint, schema_name, table_name, leaf_name IS NOT NULL AS refused,
       CASE problem
           WHEN 'unlogged' THEN 'it is UNLOGGED, and PostgreSQL does not publish unlogged tables'
           WHEN 'no key' THEN 'it has no primary key'
           WHEN 'nothing' THEN subject || ' has REPLICA IDENTITY NOTHING'
           WHEN 'index gone' THEN 'the replica identity index of ' || leaf_name
                                  || ' is gone or unusable'
           WHEN 'deferrable' THEN 'the primary key of ' || leaf_name
                                  || ' is DEFERRABLE, which PostgreSQL cannot use as replica '
                                  || 'identity'
           WHEN 'leaf without key' THEN subject || ' has no primary key'
       END || CASE WHEN leaf_name IS NOT NULL
                   THEN ', so PostgreSQL would refuse UPDATE and DELETE on it while it is '
                        || 'published'
                   WHEN problem = 'no key'
                   THEN '; lakefold keys records and copies snapshots by one'
                   ELSE '' END AS reason,
       CASE problem
           WHEN 'unlogged' THEN format('ALTER TABLE %s SET LOGGED', qualified)
           WHEN 'no key' THEN format('ALTER TABLE %s ADD PRIMARY KEY (<columns>)', qualified)
           WHEN 'nothing' THEN format('ALTER TABLE %s REPLICA IDENTITY DEFAULT', leaf_name)
           WHEN 'index gone' THEN format('ALTER TABLE %s REPLICA IDENTITY DEFAULT (the primary '
                                         'key), or USING INDEX <a unique index>', leaf_name)
           WHEN 'deferrable' THEN format('make the key NOT DEFERRABLE, or ALTER TABLE %s '
                                         'REPLICA IDENTITY FULL', leaf_name)
           WHEN 'leaf without key' THEN format('ALTER TABLE %s ADD PRIMARY KEY (<columns>)',
                                               leaf_name)
       END AS fix
FROM judged
ORDER BY schema_name, table_name
"""

#: Tables that publication %s publishes (via its tables or schemas), as OIDs.
_PUBLISHED = """
SELECT c.oid::bigint FROM pg_catalog.pg_publication_tables pt
JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = %s
"""


@dataclass(frozen=True, slots=True)
class Scope:
    """What a capture covers: every table of ``schema``, or the ``tables`` listed as
    (schema, table) pairs."""

    schema: str | None
    tables: tuple[tuple[str, str], ...] = ()

    def params(self) -> tuple[str | None, list[str], list[str]]:
        """The parameters ($1, $2, $3) of ``CANDIDATES_SQL``."""
        return (self.schema, [s for s, _ in self.tables], [t for _, t in self.tables])


@dataclass(frozen=True, slots=True)
class TableState:
    """A table of a capture's scope: publishable when ``reason`` is None, else why not and
    the statement that fixes it."""

    relid: int
    schema: str
    table: str
    reason: str | None = None
    fix: str | None = None
    refused: bool = False  # PostgreSQL refuses its UPDATE and DELETE while it is published

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.qualified, "reason": self.reason, "fix": self.fix}


def not_captured_text(state: TableState, publication: str) -> str:
    """The warning for a table of the scope that lakefold leaves out of its publication."""
    return (f"table {state.qualified} is not captured (lakefold leaves it out of publication "
            f"{publication!r}): {state.reason}. Fix: {state.fix}; lakefold then captures it "
            "from a fresh snapshot")


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What ``reconcile`` did: tables that joined or left the publication, and the tables of
    the scope that stay out (with reason and fix)."""

    added: tuple[TableState, ...]
    removed: tuple[TableState, ...]
    excluded: tuple[TableState, ...]


def candidates(conn: psycopg.Connection[Any], scope: Scope) -> list[TableState]:
    """The scope's tables as the source's catalog shows them now, each with why it is not
    publishable (or None)."""
    with psycopg.RawCursor(conn) as cur:
        rows = cur.execute(CANDIDATES_SQL, scope.params()).fetchall()
    return [TableState(int(r[0]), str(r[1]), str(r[2]), r[4], r[5], bool(r[3])) for r in rows]


def published(conn: psycopg.Connection[Any], publication: str) -> set[int]:
    """OIDs of the tables ``publication`` publishes (roots of partitioned tables)."""
    return {int(r[0]) for r in conn.execute(_PUBLISHED, (publication,)).fetchall()}


def unsafe_members(conn: psycopg.Connection[Any], publication: str) -> list[TableState]:
    """Tables in ``publication`` whose UPDATE and DELETE PostgreSQL refuses right now (a key
    dropped while no guard was watching)."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_publication_rel pr "
        "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
        "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        (publication,)).fetchall()
    scope = Scope(None, tuple((str(s), str(t)) for s, t in rows))
    return [s for s in candidates(conn, scope) if s.refused]


def reconcile(conn: psycopg.Connection[Any], publication: str, scope: Scope, *,
              lock_timeout_ms: int | None = None,
              report_excluded: bool = True) -> Reconciliation:
    """Make ``publication``'s tables exactly the publishable tables of ``scope``, in one
    transaction on ``conn`` (autocommit), and write a ``lakefold.publication`` message in it
    when tables joined or left. Schema memberships (``FOR TABLES IN SCHEMA``, which cannot
    leave a table out) are turned into table memberships; tables already published that way
    do not count as joining. Raises psycopg errors (e.g. ``LockNotAvailable`` when
    ``lock_timeout_ms`` is given and another transaction is changing the publication).
    Logs a warning per table that left, and (``report_excluded``) per table left out."""
    name = sql.Identifier(publication)
    with conn.transaction():
        if lock_timeout_ms is not None:
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                sql.Literal(f"{int(lock_timeout_ms)}ms")))
        before = published(conn, publication)
        for (schema,) in conn.execute(
                "SELECT n.nspname FROM pg_catalog.pg_publication_namespace pn "
                "JOIN pg_catalog.pg_publication p ON p.oid = pn.pnpubid "
                "JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = %s",
                (publication,)).fetchall():
            conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLES IN SCHEMA {}").format(
                name, sql.Identifier(schema)))
        members = {int(r[0]): (str(r[1]), str(r[2])) for r in conn.execute(
            "SELECT pr.prrelid::bigint, n.nspname, c.relname "
            "FROM pg_catalog.pg_publication_rel pr "
            "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
            "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
            (publication,)).fetchall()}
        states = {s.relid: s for s in candidates(conn, scope)}
        for relid, (schema, table) in members.items():
            state = states.get(relid)
            if state is None or state.reason is not None:
                conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE ONLY {}").format(
                    name, sql.Identifier(schema, table)))
        for state in states.values():
            if state.reason is None and state.relid not in members:
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE ONLY {}").format(
                    name, sql.Identifier(state.schema, state.table)))
        after = published(conn, publication)
        left = {**{r: TableState(r, s, t, "it is no longer in the capture's scope")
                   for r, (s, t) in members.items()}, **states}
        result = Reconciliation(
            added=tuple(states[r] for r in sorted(after - before)),
            removed=tuple(left[r] for r in sorted(before - after) if r in left),
            excluded=tuple(s for s in states.values() if s.reason is not None))
        if result.added or result.removed:
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                         (MESSAGE_PREFIX, encode_message(publication, result)))
    removed = {s.relid for s in result.removed}
    for state in result.excluded:
        if report_excluded or state.relid in removed:
            log.warning("%s", not_captured_text(state, publication))
    excluded = {s.relid for s in result.excluded}
    for state in result.removed:
        if state.relid not in excluded:
            log.warning("table %s left publication %r: %s", state.qualified, publication,
                        state.reason)
    return result


# -- the in-band message ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PublicationChange:
    """A ``lakefold.publication`` message: tables that joined publication ``publication``
    (to be re-snapshotted), rejoined it within one transaction without any change while out
    (nothing to do), left it, or stay out of it."""

    publication: str
    added: tuple[TableState, ...] = ()
    rejoined: tuple[TableState, ...] = ()
    removed: tuple[TableState, ...] = ()
    excluded: tuple[TableState, ...] = ()


def _encode_states(states: tuple[TableState, ...]) -> list[list[Any]]:
    return [[s.relid, s.schema, s.table, s.reason, s.fix] for s in states]


def encode_message(publication: str, result: Reconciliation) -> str:
    """The JSON content of a ``lakefold.publication`` message (the event trigger writes the
    same shape)."""
    return json.dumps({"publication": publication, "added": _encode_states(result.added),
                       "removed": _encode_states(result.removed),
                       "excluded": _encode_states(result.excluded)}, separators=(",", ":"))


def decode_message(content: bytes) -> PublicationChange | None:
    """A ``lakefold.publication`` message's content, or None when it is not one of ours."""
    try:
        doc = json.loads(content)

        def states(key: str) -> tuple[TableState, ...]:
            return tuple(TableState(int(e[0]), str(e[1]), str(e[2]),
                                    None if len(e) < 4 or e[3] is None else str(e[3]),
                                    None if len(e) < 5 or e[4] is None else str(e[4]))
                         for e in doc.get(key) or ())

        return PublicationChange(str(doc["publication"]), states("added"), states("rejoined"),
                                 states("removed"), states("excluded"))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
