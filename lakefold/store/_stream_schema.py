"""Column types of captured tables: which PostgreSQL type each column has and how its values
are typed (the "kind"), plus the per-version schema of a changelog stream.

A column's *kind* decides how its text values are converted, both to Python values
(``_text_values``) and to Arrow arrays (``_arrow_columns``). Built-in types are known by OID; user
types (enums, domains, arrays of enums, anything else) are resolved once from the source catalog and
stored in the stream schema, so that readers on another server never need the source catalog.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

# kind -> the built-in scalar type OIDs of that kind
_SCALARS: Final[dict[int, tuple[str, str]]] = {
    # oid: (typname, kind)
    16: ("bool", "bool"),
    17: ("bytea", "bytea"),
    18: ("char", "text"),
    19: ("name", "text"),
    20: ("int8", "int8"),
    21: ("int2", "int2"),
    23: ("int4", "int4"),
    25: ("text", "text"),
    26: ("oid", "other"),
    114: ("json", "json"),
    142: ("xml", "other"),
    650: ("cidr", "other"),
    700: ("float4", "float4"),
    701: ("float8", "float8"),
    790: ("money", "other"),
    829: ("macaddr", "other"),
    869: ("inet", "other"),
    1042: ("bpchar", "text"),
    1043: ("varchar", "text"),
    1082: ("date", "date"),
    1083: ("time", "time"),
    1114: ("timestamp", "timestamp"),
    1184: ("timestamptz", "timestamptz"),
    1186: ("interval", "interval"),
    1266: ("timetz", "other"),
    1560: ("bit", "other"),
    1562: ("varbit", "other"),
    1700: ("numeric", "numeric"),
    2950: ("uuid", "uuid"),
    3802: ("jsonb", "jsonb"),
}

# array OID -> element OID, for the built-in arrays of the scalars above
_ARRAYS: Final[dict[int, int]] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 1028: 26,
    199: 114, 143: 142, 651: 650, 1021: 700, 1022: 701, 791: 790, 1040: 829, 1041: 869,
    1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186,
    1270: 1266, 1561: 1560, 1563: 1562, 1231: 1700, 2951: 2950, 3807: 3802,
}

#: The kinds a value can have; "other" values are kept as text with their type name.
KINDS: Final = frozenset({
    "int2", "int4", "int8", "numeric", "float4", "float8", "text", "bool", "date", "time",
    "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb", "bytea", "enum", "array",
    "other",
})


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """How values of one PostgreSQL type are typed."""

    type_name: str
    kind: str
    element_kind: str | None = None
    element_type_name: str | None = None


def builtin_type(oid: int) -> TypeInfo | None:
    """The TypeInfo of a built-in type OID lakefold knows, or None (look it up in the catalog)."""
    scalar = _SCALARS.get(oid)
    if scalar is not None:
        return TypeInfo(scalar[0], scalar[1])
    element = _ARRAYS.get(oid)
    if element is not None:
        name, kind = _SCALARS[element]
        if kind == "other":
            return TypeInfo(f"{name}[]", "other")
        return TypeInfo(f"{name}[]", "array", kind, name)
    return None


def type_from_catalog(
    *, namespace: str, name: str, typtype: str, base_kind: str | None,
    element: TypeInfo | None,
) -> TypeInfo:
    """The TypeInfo of a type described by the source catalog.

    ``typtype`` is pg_type.typtype ('e' enum, 'd' domain, 'b' base ...); ``base_kind`` is the
    kind of a domain's base type; ``element`` is set for array types.
    """
    qualified = name if namespace in ("pg_catalog", "") else f"{namespace}.{name}"
    if element is not None:
        display = f"{element.type_name}[]"
        if element.kind in ("other", "array"):
            return TypeInfo(display, "other")
        return TypeInfo(display, "array", element.kind, element.type_name)
    if typtype == "e":
        return TypeInfo(qualified, "enum")
    if typtype == "d" and base_kind is not None and base_kind != "array":
        return TypeInfo(qualified, base_kind)
    return TypeInfo(qualified, "other")


@dataclass(frozen=True, slots=True)
class ColumnSchema:
    """One column of a captured table, as of one schema version.

    ``type_oid`` is the column's type in the source database, ``type_name`` its PostgreSQL
    name (``int4``, ``timestamptz``, ``public.mood``, ``int4[]``), ``kind`` how its values are
    typed (see ``KINDS``; arrays have ``element_kind``), ``key`` whether it is part of the
    primary key (or replica identity index) that records are keyed by.
    """

    name: str
    type_oid: int
    type_name: str
    type_modifier: int
    key: bool
    kind: str
    element_kind: str | None = None

    @property
    def numeric_precision_scale(self) -> tuple[int, int] | None:
        """(precision, scale) of a ``numeric(p, s)`` column; None when unconstrained."""
        if self.kind != "numeric" and self.element_kind != "numeric":
            return None
        if self.type_modifier < 4:
            return None
        packed = self.type_modifier - 4
        precision = (packed >> 16) & 0xFFFF
        scale = packed & 0x7FF
        scale = scale - 0x800 if scale & 0x400 else scale
        return precision, scale


@dataclass(frozen=True, slots=True)
class StreamSchema:
    """The columns of a captured table at one schema version of its changelog stream.

    Versions start at 1 and grow by one each time the source relation's shape (columns, types,
    key, replica identity) changes in the replication stream; every record carries the version
    it was written with, so ``ChangelogStore.stream_schema(stream, version)`` describes any
    record.

    ``keyless`` marks a version during which the source table had no primary key and no
    replica identity index (a key dropped and re-added in separate transactions, say). Its
    records are still keyed, by the columns flagged ``key``: the stream's previous key when
    all of its columns still exist (so a key that returns on the same columns continues the
    same keys, and compaction stays exact), otherwise the whole row (the identity PostgreSQL
    itself uses under REPLICA IDENTITY FULL). Rows that are identical in those columns are
    one key for compaction while the table has no key. Without REPLICA IDENTITY FULL the
    source refuses UPDATE and DELETE on such a table, so only inserts and truncates occur.
    """

    stream: str
    version: int
    database: str
    schema: str
    table: str
    relation_oid: int
    replica_identity: str
    columns: tuple[ColumnSchema, ...] = field(default_factory=tuple)
    keyless: bool = False

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Names of the key columns, in column order."""
        return tuple(c.name for c in self.columns if c.key)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def same_shape(self, other: StreamSchema) -> bool:
        """True when both versions have the same columns, types, key and replica identity (a
        no-op change). A change of replica identity changes the shape of before-images."""
        return self.columns == other.columns and self.relation_oid == other.relation_oid \
            and (self.schema, self.table, self.replica_identity, self.keyless) == (
                other.schema, other.table, other.replica_identity, other.keyless)

    def without_key(self, previous: StreamSchema | None) -> StreamSchema:
        """This schema of a table without a key, as a ``keyless`` version keyed by
        ``previous``'s key columns when they all still exist, else by every column."""
        carried = set(previous.key_columns) if previous is not None else set()
        if not carried or not carried <= set(self.column_names):
            carried = set(self.column_names)
        columns = tuple(replace(c, key=c.name in carried) for c in self.columns)
        return replace(self, columns=columns, keyless=True)

    def columns_json(self) -> str:
        """The columns as JSON, the form stored in ``lakefold.changelog_schemas``."""
        return json.dumps([asdict(c) for c in self.columns])

    @staticmethod
    def columns_from_json(value: Any) -> tuple[ColumnSchema, ...]:
        """The inverse of ``columns_json`` (accepts the decoded JSON too)."""
        items = json.loads(value) if isinstance(value, str | bytes) else value
        return tuple(ColumnSchema(**item) for item in items)
