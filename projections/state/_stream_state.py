"""The state of a changelog stream at a position: its latest row per key, kept in a table of
the store for one owner (a view's generation) and moved forward a range at a time.

A view recomputes the rows of the keys a batch touched over the current rows of its inputs
(see ``lakefold.projections`` on views). Those rows must be exactly the source table as of the
batch's end, and they must be found by other columns than the primary key (the orders of a
customer, the rows of a group). The changelog holds every version in position order and no
index but the position; a state table holds one row per key, with an index per column an
owner looks rows up by.

Layout
    ``lakefold.stream_states`` registers each state: owner, stream, its table in schema
    ``lakefold_state`` and ``position``, the first position *not* applied yet (1: empty).
    The table holds, per key, the last record applied: ``key`` (the changelog's key bytes),
    the record's metadata and its text values ``after`` in its own schema version's layout.
    Values stay the text PostgreSQL printed, so the typed rows a state yields are converted by
    the very function that types a changelog read (``_changelog_store.typed``): a view over
    the state and a projection over the stream see the same values.

Applying ``[position, end)`` (``apply``), in the caller's transaction, together with
whatever the caller commits beside it (the view's batch record):

1. the range's records are staged: changelog rows with one ``INSERT ... SELECT``, snapshot
   segments with one binary ``COPY`` each;
2. a truncate empties the state (every row it held is a before-image); records before the
   last truncate of the range are dropped;
3. the last record of each key wins: the rows it replaces or deletes are the before-images,
   the rows it writes the after-images; both are returned, as raw text tables;
4. ``position`` moves to ``end``.

Lookups (``rows_where``) compare a column's text values: exact for the integer, text, uuid,
boolean and date keys that joins and groups use, since the store prints each type one way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.store.exceptions import StoreError
from lakefold.store.internals import (
    StreamMeta,
    copy_records,
    empty_raw,
    snapshot_segments,
    stream_meta,
    typed,
)

STATE_SCHEMA: Final = "lakefold_state"

_DDL: Final = [
    "CREATE SCHEMA IF NOT EXISTS lakefold_state",
    """CREATE TABLE IF NOT EXISTS lakefold.stream_states (
        owner text NOT NULL,
        stream text NOT NULL,
        table_name text NOT NULL UNIQUE,
        position bigint NOT NULL DEFAULT 1,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (owner, stream))""",
]
COMPONENT: Final = migrations.register(
    "stream_states", Migration(1, "registry of the views' stream states", *_DDL))
_STAGED: Final = "lf_state_staged"
_LAST: Final = sql.Identifier("lf_state_last")  # the staged records' last per key
_COLUMNS: Final = sql.SQL(
    "key, position, ordinal, commit_lsn, xid, commit_ts, schema_version, op, after")


@dataclass(frozen=True)
class StateChanges:
    """What applying a range did to a state, as raw text tables (``raw_column`` reads a
    column's text values; ``LatestRows.typed`` types them): ``before`` holds the rows that
    were replaced or deleted, ``after`` the rows written, ``truncated`` whether a truncate
    emptied the state first (then ``before`` holds every row it had)."""

    before: pa.Table
    after: pa.Table
    truncated: bool
    start: int
    end: int

    @property
    def empty(self) -> bool:
        return self.before.num_rows == 0 and self.after.num_rows == 0 and not self.truncated


def install_states(conn: psycopg.Connection[Any]) -> None:
    """Create the state registry and schema (idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


def stage_records(conn: psycopg.Connection[Any], meta: StreamMeta, start: int,
                  end: int) -> sql.Identifier:
    """The records of ``[start, end)`` (rows and snapshot segments) in a temporary table
    (returned; ``create_scratch``'s: emptied at commit, and by the caller before another
    staging in the same transaction) with the columns of ``lakefold.changelog``; a delete's
    values are its before-image."""
    staged = sql.Identifier(_STAGED)
    # Made once per connection and emptied, not made per batch: creating a table writes the
    # catalog, 3-4 ms of a batch of one change each time (and a batch made two per input).
    with conn.pipeline():
        create_scratch(conn, staged)
        conn.execute(sql.SQL(
            "INSERT INTO {} SELECT stream_id, position, ordinal, commit_lsn, xid, commit_ts, "
            "schema_version, op, key, before, CASE WHEN op = 'd' THEN before ELSE after END "
            "FROM lakefold.changelog WHERE stream_id = %s AND position >= %s AND position < %s"
        ).format(staged), (meta.info.stream_id, start, end))
    for segment, texts in snapshot_segments.read_range(conn, meta.info.stream_id, start,
                                                         end, None):
        data = snapshot_segments.binary_copy(
            segment, texts,
            snapshot_segments.key_indexes(conn, meta.info.stream_id, segment.schema_version))
        with conn.cursor() as cur, cur.copy(sql.SQL(
                "COPY {} (position, ordinal, commit_lsn, xid, commit_ts, stream_id, "
                "schema_version, op, key, before, after) FROM STDIN (FORMAT BINARY)")
                .format(staged)) as copy:
            copy.write(data)  # a snapshot's records are reads: no delete among them
    return staged


def create_scratch(conn: psycopg.Connection[Any], table: sql.Identifier) -> None:
    """An empty temporary table of this connection shaped like ``lakefold.changelog``, made
    when missing and kept (its rows are deleted at each commit)."""
    conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE lakefold.changelog) "
                         "ON COMMIT DELETE ROWS").format(table))
    conn.execute(sql.SQL("DELETE FROM {}").format(table))


def state_table_name(owner: str, stream: str) -> str:
    """The state's table in ``lakefold_state``: a digest, so any owner and stream fit
    PostgreSQL's 63-byte names."""
    return "s_" + hashlib.sha256(f"{owner}\x00{stream}".encode()).hexdigest()[:32]


class LatestRows:
    """The state of ``stream`` kept for ``owner``: its latest row per key (see the module
    docstring). Every method takes the connection to use, so a caller puts a state's changes
    in its own transaction."""

    def __init__(self, owner: str, stream: str) -> None:
        self.owner = owner
        self.stream = stream
        self.table = sql.Identifier(STATE_SCHEMA, state_table_name(owner, stream))
        #: The stream's schema versions, read again by ``create`` and ``apply`` (a state holds
        #: no version newer than what its last ``apply`` read).
        self._meta: StreamMeta | None = None

    def meta(self, conn: psycopg.Connection[Any]) -> StreamMeta:
        """The stream's schema versions as of the last ``create`` or ``apply``."""
        if self._meta is None:
            self._meta = stream_meta(conn, self.stream)
        return self._meta

    def create(self, conn: psycopg.Connection[Any], lookups: Iterable[str] = ()) -> None:
        """Create the state (empty, at position 1) if it does not exist, with an index for
        each column in ``lookups``."""
        install_states(conn)
        with conn.transaction():
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key bytea PRIMARY KEY, position bigint NOT NULL, "
                "ordinal bigint NOT NULL, commit_lsn bigint NOT NULL, xid bigint NOT NULL, "
                "commit_ts timestamptz NOT NULL, schema_version integer NOT NULL, "
                "op \"char\" NOT NULL, after text[])").format(self.table))
            conn.execute("INSERT INTO lakefold.stream_states (owner, stream, table_name) "
                         "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                         (self.owner, self.stream, state_table_name(self.owner, self.stream)))
            meta = self._meta = stream_meta(conn, self.stream)
            for column in lookups:
                for index in sorted(set(self._indexes(meta, column).values())):
                    name = f"{state_table_name(self.owner, self.stream)}_v{index}"
                    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ((after[{}]))")
                                 .format(sql.Identifier(name), self.table,
                                         sql.Literal(index)))

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Delete the state (idempotent)."""
        with conn.transaction():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
            conn.execute("DELETE FROM lakefold.stream_states WHERE owner = %s AND stream = %s",
                         (self.owner, self.stream))

    def position(self, conn: psycopg.Connection[Any], *, lock: bool = False) -> int:
        """The first position not applied yet (1 for an empty state)."""
        row = conn.execute(sql.SQL(
            "SELECT position FROM lakefold.stream_states WHERE owner = %s AND stream = %s {}")
            .format(sql.SQL("FOR UPDATE" if lock else "")), (self.owner, self.stream)).fetchone()
        if row is None:
            raise StoreError(f"no state of {self.stream} for {self.owner}; create it first")
        return int(row[0])

    def _position_and_meta(self, conn: psycopg.Connection[Any]) -> tuple[int, StreamMeta]:
        """The state's position (its row locked) and the stream's meta, in one round trip
        while the stream keeps the schema version of the meta read last (a new version, or a
        stream dropped and made again, reads it anew)."""
        row = conn.execute(
            "SELECT st.position, cs.stream_id, cs.head, cs.schema_version, cs.last_commit_ts "
            "FROM lakefold.stream_states st LEFT JOIN lakefold.changelog_streams cs "
            "ON cs.name = st.stream WHERE st.owner = %s AND st.stream = %s FOR UPDATE OF st",
            (self.owner, self.stream)).fetchone()
        if row is None:
            raise StoreError(f"no state of {self.stream} for {self.owner}; create it first")
        position, stream_id, head, version, last_commit_ts = row
        known = self._meta
        if (known is None or stream_id is None or known.info.stream_id != stream_id
                or known.info.schema_version != version):
            self._meta = stream_meta(conn, self.stream)
        else:
            self._meta = StreamMeta(replace(known.info, head=int(head),
                                            last_commit_ts=last_commit_ts), known.versions)
        return int(position), self._meta

    # ------------------------------------------------------------------ applying a range

    def apply(self, conn: psycopg.Connection[Any], end: int, *, images: bool = True
              ) -> StateChanges:
        """Apply the stream's records from the state's position up to ``end`` (exclusive,
        capped at the stream's head); see the module docstring. Without ``images``, the
        before- and after-images are not read (the changes returned hold no rows)."""
        with conn.transaction():
            start, meta = self._position_and_meta(conn)
            end = min(end, meta.info.head + 1)
            if end <= start:
                empty = empty_raw(meta)
                return StateChanges(empty, empty, False, start, max(start, end))
            stage_records(conn, meta, start, end)
            top = conn.execute(sql.SQL("SELECT max(position) FROM {} WHERE op = 't'")
                               .format(sql.Identifier(_STAGED))).fetchone()
            truncate_at = top[0] if top is not None else None
            truncated = truncate_at is not None
            before = empty_raw(meta)
            if truncated:
                if images:
                    before = self._raw(conn, meta, sql.SQL("SELECT * FROM {}").format(self.table))
                conn.execute(sql.SQL("TRUNCATE {}").format(self.table))
                conn.execute(sql.SQL("DELETE FROM {} WHERE position <= %s")
                             .format(sql.Identifier(_STAGED)), (truncate_at,))
            with conn.pipeline():  # statements whose results are not read: one round trip
                create_scratch(conn, _LAST)
                conn.execute(sql.SQL(
                    "INSERT INTO {} SELECT DISTINCT ON (key) * FROM {} WHERE key IS NOT NULL "
                    "ORDER BY key, position DESC").format(_LAST, sql.Identifier(_STAGED)))
                # Without statistics the planner guesses the batch's size and may hash-join
                # the whole state; with them, a small batch probes the state's key index.
                conn.execute("ANALYZE lf_state_last")
            if not truncated and images:
                before = self._raw(conn, meta, sql.SQL(
                    "SELECT s.* FROM {} s JOIN lf_state_last l ON l.key = s.key")
                    .format(self.table))
            after = self._raw(conn, meta, sql.SQL(
                "SELECT * FROM lf_state_last WHERE op <> 'd'")) if images else empty_raw(meta)
            with conn.pipeline():
                conn.execute(sql.SQL("DELETE FROM {} s USING lf_state_last l "
                                     "WHERE s.key = l.key").format(self.table))
                conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM lf_state_last "
                                     "WHERE op <> 'd'").format(self.table, _COLUMNS, _COLUMNS))
                conn.execute(sql.SQL("DELETE FROM {}").format(_LAST))
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(_STAGED)))
                conn.execute("UPDATE lakefold.stream_states SET position = %s "
                             "WHERE owner = %s AND stream = %s", (end, self.owner, self.stream))
        return StateChanges(before, after, truncated, start, end)

    def move_to(self, conn: psycopg.Connection[Any], other: LatestRows,
                positions: Iterable[int] = (), *, column: str | None = None,
                texts: Iterable[str | None] = ()) -> int:
        """Move rows of this state into ``other`` (a state of the same stream kept aside,
        such as an interval join's forgotten events): those written by the records at
        ``positions``, or those whose ``column`` has one of ``texts``. Returns how many
        moved."""
        if column is not None:
            where = self._where(conn, column, texts)
        else:
            wanted = sorted(set(positions))
            if not wanted:
                return 0
            where = sql.SQL("position = ANY({})").format(sql.Literal(wanted))
        return conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {} WHERE {} RETURNING *) INSERT INTO {} "
            "SELECT * FROM moved ON CONFLICT (key) DO NOTHING").format(
                self.table, where, other.table)).rowcount

    # ------------------------------------------------------------------ reading

    def _where(self, conn: psycopg.Connection[Any], column: str,
               texts: Iterable[str | None]) -> sql.Composable:
        """The condition: ``column`` has one of the text values ``texts`` (None: NULL)."""
        meta = self.meta(conn)
        values = set(texts)
        wanted = sorted(v for v in values if v is not None)
        by_version = self._indexes(meta, column)
        array = sql.SQL("{}::text[]").format(sql.Literal(wanted))
        tests = []
        for version, index in sorted(by_version.items()):
            value = sql.SQL("after[{}]").format(sql.Literal(index))
            match = [sql.SQL("{} = ANY({})").format(value, array)] if wanted else []
            if None in values:
                match.append(sql.SQL("{} IS NULL").format(value))
            if match:
                tests.append(sql.SQL("(schema_version = {} AND ({}))").format(
                    sql.Literal(version), sql.SQL(" OR ").join(match)))
        return sql.SQL(" OR ").join(tests) if tests else sql.SQL("false")

    def rows_where(self, conn: psycopg.Connection[Any], column: str,
                   texts: Iterable[str | None]) -> pa.Table:
        """The state's rows whose ``column`` has one of the text values ``texts`` (None
        matches NULL), as raw text rows."""
        return self._raw(conn, self.meta(conn), sql.SQL("SELECT * FROM {} WHERE {}").format(
            self.table, self._where(conn, column, texts)))

    def rows(self, conn: psycopg.Connection[Any]) -> pa.Table:
        """Every row of the state, as raw text rows."""
        return self._raw(conn, self.meta(conn),
                         sql.SQL("SELECT * FROM {}").format(self.table))

    def typed(self, conn: psycopg.Connection[Any], raw: pa.Table) -> pa.Table:
        """Raw text rows typed as a changelog read types them (metadata columns first)."""
        return typed(raw, self.meta(conn))

    def raw_column(self, conn: psycopg.Connection[Any], raw: pa.Table,
                   column: str) -> list[str | None]:
        """The text values of ``column`` in raw rows (each row read in its schema version's
        layout; None where the version lacks the column)."""
        values: list[str | None] = self.raw_array(conn, raw, column).to_pylist()
        return values

    def raw_array(self, conn: psycopg.Connection[Any], raw: pa.Table,
                  column: str) -> pa.Array:
        """``raw_column`` as an Arrow string array (no Python objects per value)."""
        by_version = self._indexes(self.meta(conn), column)
        out: pa.Array | pa.ChunkedArray = pa.nulls(raw.num_rows, pa.string())
        if raw.num_rows == 0:
            return out
        versions = raw.column("_schema_version")
        for version, index in by_version.items():
            out = pc.if_else(pc.equal(versions, version), raw.column(f"v{index}"), out)
        if isinstance(out, pa.ChunkedArray):
            return out.combine_chunks()
        return out

    def _indexes(self, meta: StreamMeta, column: str) -> dict[int, int]:
        """Schema version → the 1-based index of ``column`` in that version's values."""
        found = {version: i + 1 for version, schema in meta.versions.items()
                 for i, c in enumerate(schema.columns) if c.name == column}
        if not found:
            latest = meta.latest
            names = [c.name for c in latest.columns] if latest is not None else []
            raise StoreError(f"{self.stream} has no column {column!r}; its columns are "
                             f"{', '.join(names) or '(none yet)'}")
        return found

    @staticmethod
    def _raw(conn: psycopg.Connection[Any], meta: StreamMeta, rows: sql.Composable) -> pa.Table:
        return copy_records(conn, meta, sql.SQL("SELECT r.*, r.after AS v FROM ({}) r")
                            .format(rows))
