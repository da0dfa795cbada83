"""What a snapshot needs to know about a source table: its columns exactly as pgoutput would
describe them in a Relation message, its key, and SQL fragments to walk it in key order.

Snapshots describe their rows with the same ``pgo.Relation`` the replication stream uses, so
the stream schema a snapshot registers is identical to the one the first Relation message of
the stream produces (``SourceCatalog.relation_schema`` turns both into a ``StreamSchema``).

Snapshots read values in the text pgoutput sends: each type's *output function*. ``col::text``
is that text for most types (a cast to text through the output function), but not for those
whose cast to text is a function of its own or a binary reinterpretation: ``boolean`` (``true``,
not ``t``), ``char(n)`` (trailing blanks removed), ``inet`` (a ``/32`` mask added), ``xml``,
``name``, ``"char"`` (before PostgreSQL 15 its cast returned the raw byte), user types with
such casts, and domains over any of these (a domain takes its base type's cast). Those columns
are read with ``concat(col)``, which calls the output function (a CASE keeps NULL a NULL);
only those, because ``concat`` looks the output function up for every value, which makes a
read of ordinary columns slower than ``::text`` (see ``_TEXT_CAST_DIFFERS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

from lakefold.capture.decoding import _pgoutput as pgo
from lakefold.capture.exceptions import SourceConfigurationError


@dataclass(frozen=True, slots=True)
class TableShape:
    """A source table: OID, names, replica identity (``d``efault, ``f``ull, ``i``ndex,
    ``n``othing), the columns pgoutput publishes (no dropped or generated ones) with its key
    flags, and the key that orders snapshot chunks (primary key, or replica identity index,
    in index order)."""

    relid: int
    schema: str
    table: str
    replica_identity: str
    columns: tuple[pgo.RelationColumn, ...]
    order_key: tuple[str, ...]
    output_text: frozenset[str] = frozenset()  # columns ``::text`` would print otherwise

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.table)

    def relation(self) -> pgo.Relation:
        """The Relation message pgoutput would send for this table right now."""
        return pgo.Relation(None, self.relid, self.schema, self.table, self.replica_identity,
                            self.columns)

    def stream_name(self, prefix: str) -> str:
        return f"{prefix}{self.schema}.{self.table}"

    def column_list(self) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(c.name) for c in self.columns)

    def as_text(self, column: str) -> sql.Composable:
        """``column`` in the text form pgoutput sends (under the replication session's
        settings, see ``_replication_connection.SESSION_OPTIONS``): its type's output text, or
        NULL."""
        ident = sql.Identifier(column)
        if column in self.output_text:
            return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE pg_catalog.concat({0}) END"
                           ).format(ident)
        return sql.SQL("{}::text").format(ident)

    def text_columns(self) -> sql.Composable:
        """``c1::text AS lakefold_c0, ...``: every column as ``as_text``. The aliases matter:
        an unaliased ``c1::text`` is an output column named ``c1``, which an ``ORDER BY c1``
        of the same query would sort as text."""
        return sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(self.as_text(c.name), sql.Identifier(f"lakefold_c{i}"))
            for i, c in enumerate(self.columns))

    def order_tuple(self) -> sql.Composable:
        """``(k1, k2)``: the key as a row value, for comparisons and ORDER BY."""
        return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(k)
                                                          for k in self.order_key))

    def order_by(self) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(k) for k in self.order_key)

    def order_key_text(self) -> sql.Composable:
        """The order key's columns as ``as_text`` (the same text as ``text_columns``, so keys
        read either way compare equal)."""
        return sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(self.as_text(k), sql.Identifier(f"lakefold_k{i}"))
            for i, k in enumerate(self.order_key))

    def placeholders(self) -> sql.Composable:
        """``(%s, %s)`` for a key given as text values (sent untyped; the server casts them
        to the key columns' types)."""
        return sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder()
                                                          for _ in self.order_key))

    @property
    def order_positions(self) -> tuple[int, ...]:
        """Index of each order-key column among ``columns``."""
        names = [c.name for c in self.columns]
        return tuple(names.index(k) for k in self.order_key)


def table_shape(conn: psycopg.Connection[Any], relid: int) -> TableShape:
    """The shape of table ``relid`` as seen by ``conn``'s current snapshot."""
    row = conn.execute(
        "SELECT n.nspname, c.relname, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,),
    ).fetchone()
    if row is None:
        raise SourceConfigurationError(f"table with OID {relid} no longer exists in the source")
    schema, table, identity = row[0], row[1], str(row[2])
    attrs = conn.execute(
        "SELECT attname, atttypid::bigint, atttypmod FROM pg_attribute WHERE attrelid = %s "
        "AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (relid,),
    ).fetchall()
    flagged: set[str]
    if identity == "f":
        flagged = {a[0] for a in attrs}
    elif identity in ("d", "i"):
        flagged = set(_index_columns(conn, relid, primary=identity == "d"))
    else:
        flagged = set()
    order = _index_columns(conn, relid, primary=True) or _index_columns(conn, relid,
                                                                          primary=False)
    if not order:
        raise SourceConfigurationError(
            f"table {schema}.{table} has no primary key and no replica identity index, so its "
            "rows cannot be keyed or copied in key order; add a primary key")
    columns = tuple(pgo.RelationColumn(name in flagged, name, int(oid), int(mod))
                    for name, oid, mod in attrs)
    output_text = frozenset(r[0] for r in conn.execute(_TEXT_CAST_DIFFERS, (relid,)))
    return TableShape(relid, schema, table, identity, columns, tuple(order), output_text)


# The columns of a table whose ``::text`` is not their type's output text: the type, or the
# base type of a domain (domains of domains followed down), has a cast to text that is not
# through I/O ('f'unction or 'b'inary), except a binary cast of a type whose output function
# prints the stored text as it is (varchar and the like: ``::text`` is the same text).
# Measured (ADBC read of 1M rows, 2 cores): on the snapshot bench's table (bigint, text, int,
# timestamptz, numeric) ``format``/``concat`` for every column read 1.0-1.2M rows/s against
# 1.2-1.7M for ``::text``; on a pgbench_accounts-like table (three ints and a char(84) filler)
# ``concat`` for the filler alone read 1.4-1.8M rows/s against 0.8-1.2M for ``::text``, whose
# rtrim costs more than printing the blanks.
_TEXT_CAST_DIFFERS: Final = """
WITH RECURSIVE types (attname, typid) AS (
    SELECT attname, atttypid FROM pg_attribute
    WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped
  UNION ALL
    SELECT types.attname, t.typbasetype FROM types JOIN pg_type t ON t.oid = types.typid
    WHERE t.typtype = 'd'
)
SELECT types.attname FROM types JOIN pg_type t ON t.oid = types.typid
WHERE t.typtype <> 'd'
  AND t.typoutput NOT IN ('pg_catalog.textout'::regproc, 'pg_catalog.varcharout'::regproc)
  AND EXISTS (SELECT FROM pg_cast c WHERE c.castsource = types.typid
              AND c.casttarget = 'pg_catalog.text'::regtype AND c.castmethod <> 'i')
"""


def _index_columns(conn: psycopg.Connection[Any], relid: int, *, primary: bool) -> list[str]:
    flag = sql.SQL("i.indisprimary" if primary else "i.indisreplident")
    rows = conn.execute(sql.SQL(
        "SELECT a.attname FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND {} ORDER BY k.n").format(flag), (relid,)).fetchall()
    return [r[0] for r in rows]


def capture_tables(conn: psycopg.Connection[Any], relids: list[int]) -> list[int]:
    """The tables a snapshot reads for ``relids``, ordered by name. The capture publishes
    partitioned tables via their root (``publish_via_partition_root``: one stream per table),
    so a partitioned table is read as a whole through its root."""
    rows = conn.execute(
        "SELECT c.oid::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = ANY(%s::oid[]) AND c.relkind IN ('r', 'p') ORDER BY n.nspname, c.relname",
        (relids,)).fetchall()
    return [int(r[0]) for r in rows]


def find_table(conn: psycopg.Connection[Any], name: str) -> int:
    """The OID of table ``schema.table`` (or ``table`` in ``public``); a clear error when it
    does not exist."""
    schema, sep, table = name.strip().rpartition(".")
    schema = schema if sep else "public"
    row = conn.execute(
        "SELECT c.oid::bigint, c.relkind FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    if row is None:
        raise SourceConfigurationError(
            f"table {schema}.{table} does not exist in the source database; check the name "
            "(schema.table)")
    if row[1] not in ("r", "p"):
        raise SourceConfigurationError(
            f"{schema}.{table} is not a table (relkind {row[1]!r}); only tables can be "
            "snapshotted")
    return int(row[0])
