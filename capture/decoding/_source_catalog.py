"""Type and key lookups in the source catalog for Relation messages: ``SourceCatalog``, the
decoder's ``SchemaResolver``, which turns a Relation message into a stream schema.

It runs over an ordinary (non-replication) connection to the source. Snapshots use it too, so
that the stream schema a snapshot registers is the one the stream's first Relation produces.
"""

from __future__ import annotations

from typing import Any

import psycopg

from lakefold.capture.decoding import _pgoutput as pgo
from lakefold.store.internals import (
    ColumnSchema,
    StreamSchema,
    TypeInfo,
    builtin_type,
    type_from_catalog,
)


class SourceCatalog:
    """Type and key lookups in the source catalog, cached; implements the decoder's
    ``SchemaResolver``. Uses its own connection (autocommit)."""

    def __init__(self, conn: psycopg.Connection[Any], *, database: str) -> None:
        self._conn = conn
        self._database = database
        self._types: dict[int, TypeInfo] = {}
        self._announced: dict[int, pgo.Type] = {}

    def note_type(self, message: pgo.Type) -> None:
        self._announced[message.type_oid] = message

    def type_info(self, oid: int) -> TypeInfo:
        """How values of type ``oid`` are typed."""
        known = builtin_type(oid) or self._types.get(oid)
        if known is not None:
            return known
        row = self._conn.execute(
            "SELECT n.nspname, t.typname, t.typtype, t.typelem, t.typbasetype, t.typcategory "
            "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = %s",
            (oid,),
        ).fetchone()
        if row is None:
            announced = self._announced.get(oid)
            name = f"{announced.namespace}.{announced.name}" if announced else f"oid {oid}"
            info = TypeInfo(name, "other")
        else:
            namespace, name, typtype, elem, base, category = row
            element = self.type_info(int(elem)) if category == "A" and elem else None
            base_kind = self.type_info(int(base)).kind if typtype == "d" and base else None
            info = type_from_catalog(namespace=namespace, name=name, typtype=typtype,
                                     base_kind=base_kind, element=element)
        self._types[oid] = info
        return info

    def primary_key(self, relid: int) -> list[str]:
        """Primary key column names of ``relid`` (or of its replica identity index)."""
        rows = self._conn.execute(
            "SELECT i.indexrelid, a.attname FROM pg_index i "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND (i.indisprimary OR i.indisreplident) "
            "ORDER BY i.indisprimary DESC, i.indexrelid, k.n",
            (relid,),
        ).fetchall()
        names: list[str] = []
        for index, name in rows:
            if index != rows[0][0]:
                break  # only the first index: the primary key when there is one
            names.append(name)
        return names

    def relation_schema(self, message: pgo.Relation, *, stream: str) -> StreamSchema:
        """The stream schema for a Relation message. The server flags the key columns as of
        the change (its historic catalog), which is exact for REPLICA IDENTITY DEFAULT: no
        flag there means the table had no primary key then (a keyless version, see
        ``StreamSchema``). With REPLICA IDENTITY FULL every column is flagged, and with
        NOTHING none, so the key is taken from the primary key in the current catalog."""
        flagged = [c.name for c in message.columns if c.key]
        if message.replica_identity in ("f", "n") or (message.replica_identity == "i"
                                                       and not flagged):
            keys = set(self.primary_key(message.relid))
        else:
            keys = set(flagged)
        columns = []
        for column in message.columns:
            info = self.type_info(column.type_oid)
            columns.append(ColumnSchema(
                name=column.name, type_oid=column.type_oid, type_name=info.type_name,
                type_modifier=column.type_modifier, key=column.name in keys, kind=info.kind,
                element_kind=info.element_kind,
            ))
        return StreamSchema(
            stream=stream, version=0, database=self._database, schema=message.namespace,
            table=message.name, relation_oid=message.relid,
            replica_identity=message.replica_identity, columns=tuple(columns),
        )
