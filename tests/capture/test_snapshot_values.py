"""A snapshot, a re-snapshot and the replication stream store every value of every type the
decoder knows in one form: PostgreSQL's output text, as pgoutput and test_decoding print it.

Each example is a table of rows of edge values (NULLs, empty values, extremes, unicode,
padding, masks, infinities, BC and year > 9999, 24:00, arrays with NULL elements and several
dimensions, TOASTed values) whose key mixes the types where a query's ``::text`` and the
output function disagree (``char(n)``, ``boolean``, ``inet``). Every row reaches the store four
more times after the initial snapshot's ``read``: as an ``update`` of itself (its TOASTed
values filled from the snapshot's record), as an ``insert`` of a copy under another id, and as
two re-snapshot ``read``s (the row and its copy). All five records must hold the same text,
equal to test_decoding's, the same key, and the same typed values (``read_events`` and the
Arrow read), equal to the source's own (``value_oracle``).
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from psycopg import sql

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    Interval,
    SnapshotPolicy,
    resnapshot,
)
from lakefold.store import _snapshot_segments, _stream_schema
from lakefold.store._changelog_writer import split_key
from tests.capture.conftest import capture_now, execute
from tests.capture.test_values import SESSION, parse_test_decoding
from tests.capture.value_oracle import differences, source_values
from tests.fixtures.postgres import PostgresServer, TestDatabase, drop_database

pytestmark = pytest.mark.timeout(240)

_RNG = random.Random(18)
# Values large and random enough to be stored out of line (TOAST) even after compression.
BIG_TEXT = "".join(_RNG.choice("abcdefghijklmnopqrstuvwxyz0123456789 é€😀'\"\\\n")
                   for _ in range(6_000))
BIG_BYTES = "\\x" + _RNG.randbytes(4_000).hex()
BIG_JSON = "{" + ", ".join(f'"k{i}": {_RNG.random()!r}' for i in range(400)) + "}"

TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'so so', 'é');
CREATE DOMAIN dbool AS boolean;
CREATE DOMAIN dbool2 AS dbool;
CREATE DOMAIN dchar AS char(4);
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
"""
KEY = ("id", "k_char", "k_flag", "k_addr")
KEY_DDL = "id int, k_char char(3), k_flag boolean, k_addr inet"
KEY_VALUES = (("a", "", "ab"), ("true", "false"), ("10.1.2.3", "::1", "10.1.2.0/24"))
COPY_OFFSET = 1_000  # a row's streamed copy has id + COPY_OFFSET


@dataclass(frozen=True)
class Column:
    """A column of the example table: its type, its edge values as input text, and (for
    user array types psycopg does not know) the type the oracle reads it as."""

    name: str
    type: str
    edges: tuple[str, ...]
    oracle_cast: str | None = None
    needs: str | None = None  # "xml" or "pg17": values only where the server supports them


COLUMNS: tuple[Column, ...] = (
    Column("c_bool", "boolean", ("true", "false")),
    Column("c_int2", "smallint", ("-32768", "32767", "0")),
    Column("c_int4", "integer", ("-2147483648", "2147483647")),
    Column("c_int8", "bigint", ("-9223372036854775808", "9223372036854775807")),
    Column("c_oid", "oid", ("0", "4294967295")),
    Column("c_numeric", "numeric", ("NaN", "Infinity", "-Infinity", "0.10", "1e300",
                                    "12345678901234567890.123456789",
                                    "-0.000000000000000000001")),
    Column("c_numeric_ps", "numeric(12, 3)", ("NaN", "-123456789.123", "0.1")),
    Column("c_float4", "real", ("NaN", "Infinity", "-Infinity", "-0", "1.17549435e-38",
                                "3.4028235e38", "0.1")),
    Column("c_float8", "double precision", ("NaN", "Infinity", "-Infinity", "-0", "5e-324",
                                            "1.7976931348623157e308", "0.1")),
    Column("c_money", "money", ("-92233720368547758.08", "92233720368547758.07", "0")),
    Column("c_text", "text", ("", "NULL", " é€😀 ", "quote ' back\\slash \"dq\" tab\t nl\n",
                              BIG_TEXT)),
    Column("c_varchar", "varchar(20)", ("", "trailing  ", "ü")),
    Column("c_bpchar", "char(5)", ("", "ab", "abcde", "é", " a")),
    Column("c_char1", '"char"', ("", "a", "é", " ")),
    Column("c_name", "name", ("", "x" * 63, "é")),
    Column("c_bytea", "bytea", ("\\x", "\\x00ff10", BIG_BYTES)),
    Column("c_json", "json", ('{"a": 1, "a": 2}', " [1,  2.50] ", "12345678901234567890.123456789",
                              '{"b": 1, "a": {"d": null}}', '"\\u0000é"', "null")),
    Column("c_jsonb", "jsonb", ('{"a": 12345678901234567890.123456789, "b": [1e400, -0.0, 1.50]}',
                                "[]", "{}", "null", '"é"', BIG_JSON)),
    Column("c_uuid", "uuid", ("00000000-0000-0000-0000-000000000000",
                              "ffffffff-ffff-ffff-ffff-ffffffffffff")),
    Column("c_date", "date", ("infinity", "-infinity", "4713-01-01 BC", "5874897-12-31",
                              "2000-02-29", "0001-01-01", "10000-01-01")),
    Column("c_time", "time", ("00:00:00", "24:00:00", "23:59:59.999999")),
    Column("c_timetz", "timetz", ("00:00:00+1559", "24:00:00-1559", "12:00:00.5+05:30")),
    Column("c_timestamp", "timestamp", ("infinity", "-infinity", "4713-01-01 00:00:00 BC",
                                        "294276-12-31 23:59:59.999999",
                                        "2000-01-01 00:00:00.000001", "10000-01-01 00:00:00")),
    Column("c_timestamptz", "timestamptz", ("infinity", "-infinity", "4713-01-01 00:00:00+00 BC",
                                            "294276-12-31 23:59:59.999999+00",
                                            "2000-01-01 05:30:00.000001+05:30",
                                            "10000-01-01 00:00:00+00")),
    Column("c_interval", "interval", ("1 year 2 mons 3 days 04:05:06.789", "-1 days -00:00:01",
                                      "0", "178000000 years", "-178000000 years",
                                      "1 mon -1 days", "00:00:00.000001")),
    Column("c_interval_inf", "interval", ("infinity", "-infinity"), needs="pg17"),
    Column("c_inet", "inet", ("10.1.2.3", "10.1.2.3/32", "10.1.2.0/24", "::1", "2001:db8::1/64",
                              "::ffff:1.2.3.4")),
    Column("c_cidr", "cidr", ("10.0.0.0/8", "10.1.2.3/32", "::/0", "2001:db8::/32")),
    Column("c_macaddr", "macaddr", ("08:00:2b:01:02:03", "ff:ff:ff:ff:ff:ff")),
    Column("c_bit", "bit(4)", ("1010", "0000")),
    Column("c_varbit", "varbit", ("", "1", "101010")),
    Column("c_xml", "xml", ('<a x="1"/>', '<?xml version="1.0"?><a/>', "text &amp; more"),
           needs="xml"),
    Column("c_enum", "mood", ("sad", "so so", "é")),
    Column("c_dbool", "dbool", ("true", "false")),
    Column("c_dbool2", "dbool2", ("true", "false")),
    Column("c_dchar", "dchar", ("ab", "", "abcd")),
    Column("c_dint", "posint", ("1", "2147483647")),
    Column("a_bool", "boolean[]", ("{}", "{t,f,NULL}", "{{t,f},{NULL,t}}")),
    Column("a_int2", "smallint[]", ("{-32768,NULL,32767}",)),
    Column("a_int4", "integer[]", ("{}", "{1,NULL,3}", "{{1,2},{3,NULL}}", "[0:1]={1,2}")),
    Column("a_int8", "bigint[]", ("{-9223372036854775808,NULL}",)),
    Column("a_oid", "oid[]", ("{0,NULL}",)),
    Column("a_numeric", "numeric[]", (
        "{NaN,Infinity,-Infinity,NULL,1.10,12345678901234567890.123456789}",)),
    Column("a_float4", "real[]", ("{NaN,-0,Infinity,NULL}",)),
    Column("a_float8", "double precision[]", ("{NaN,-Infinity,5e-324,NULL}",)),
    Column("a_money", "money[]", ("{1.5,NULL}",)),
    Column("a_text", "text[]", ('{"a b","c,d",NULL,"NULL","","q\\"t","back\\\\slash","é😀"}',
                                "{{a,b},{c,NULL}}")),
    Column("a_varchar", "varchar(5)[]", ('{"",x,NULL}',)),
    Column("a_bpchar", "char(3)[]", ('{a,NULL,abc,""}',)),
    Column("a_char1", '"char"[]', ("{a,é,NULL}",)),
    Column("a_name", "name[]", ('{x,NULL,""}',)),
    Column("a_bytea", "bytea[]", ('{"\\\\x00ff",NULL,"\\\\x"}',)),
    Column("a_json", "json[]", (
        '{"{\\"a\\": 1, \\"a\\": 2}",NULL,12345678901234567890.123456789}',)),
    Column("a_jsonb", "jsonb[]", ('{"{\\"k\\": 1.50}",NULL,"null"}',)),
    Column("a_uuid", "uuid[]", ("{00000000-0000-0000-0000-000000000000,NULL}",)),
    Column("a_date", "date[]", ('{infinity,-infinity,NULL,2000-01-01,"0044-03-15 BC"}',)),
    Column("a_time", "time[]", ("{24:00:00,NULL,00:00:00.000001}",)),
    Column("a_timetz", "timetz[]", ("{00:00:00+1559,NULL}",)),
    Column("a_timestamp", "timestamp[]", ('{infinity,NULL,"2000-01-01 00:00:00"}',)),
    Column("a_timestamptz", "timestamptz[]", ('{-infinity,NULL,"2000-01-01 00:00:00+00"}',)),
    Column("a_interval", "interval[]", ('{"1 year",NULL,"-1 days -00:00:01"}',)),
    Column("a_inet", "inet[]", ("{10.1.2.3,NULL,10.0.0.0/8}",)),
    Column("a_cidr", "cidr[]", ("{10.0.0.0/8,NULL}",)),
    Column("a_macaddr", "macaddr[]", ("{08:00:2b:01:02:03,NULL}",)),
    Column("a_bit", "bit(2)[]", ("{10,NULL}",)),
    Column("a_varbit", "varbit[]", ('{"",1,NULL}',)),
    Column("a_xml", "xml[]", ('{"<a/>",NULL}',), needs="xml"),
    Column("a_enum", "mood[]", ('{sad,NULL,"so so"}',), oracle_cast="text[]"),
    Column("a_dbool", "dbool[]", ("{t,NULL,f}",), oracle_cast="boolean[]"),
)
EDGE_ROWS = max(len(c.edges) for c in COLUMNS)

# A row: per column, None (NULL), an int (that edge value, modulo their number) or a str
# (that input text).
Row = dict[str, int | str | None]

_GENERATED: dict[str, st.SearchStrategy[str]] = {
    "c_text": st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                      max_size=12),
    "c_int8": st.integers(-2**63, 2**63 - 1).map(str),
    "c_float8": st.floats().map(repr),
    "c_numeric": st.decimals(allow_nan=False, allow_infinity=False).map(str),
}


def _value(column: Column) -> st.SearchStrategy[int | str | None]:
    choices: list[st.SearchStrategy[Any]] = [st.none(), st.integers(0, 20)]
    if column.name in _GENERATED:
        choices.append(_GENERATED[column.name])
    return st.one_of(*choices)


ROWS = st.lists(st.fixed_dictionaries({c.name: _value(c) for c in COLUMNS}),
                min_size=1, max_size=3)
# Every edge value of every column at least once, and a row of NULLs.
ALL_EDGES: list[Row] = [{c.name: i if i < EDGE_ROWS else None for c in COLUMNS}
                        for i in range(EDGE_ROWS + 1)]


@given(rows=ROWS)
@example(rows=ALL_EDGES)
@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_snapshot_resnapshot_and_stream_store_the_same_values(
        postgres_server: PostgresServer, rows: list[Row]) -> None:
    name = f"v_{uuid.uuid4().hex[:12]}"
    execute(postgres_server.admin_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        _check_paths(postgres_server.dsn_for(name), rows)
    finally:
        drop_database(postgres_server, name)


def _supported(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        features = {"pg17"} if conn.info.server_version >= 170000 else set()
        try:
            conn.execute("SELECT '<a/>'::xml")
            features.add("xml")
        except psycopg.errors.FeatureNotSupported:  # built without libxml
            pass
    return features


def _input(column: Column, value: int | str | None, features: set[str]) -> str | None:
    if value is None or (column.needs is not None and column.needs not in features):
        return None
    return column.edges[value % len(column.edges)] if isinstance(value, int) else value


def _create(dsn: str, rows: list[Row], features: set[str]) -> None:
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type))
                                 for c in COLUMNS)
    execute(dsn, TYPES, sql.SQL("CREATE TABLE t ({}, {}, PRIMARY KEY ({}))").format(
        sql.SQL(KEY_DDL), columns, sql.SQL(", ").join(map(sql.Identifier, KEY))))
    insert = sql.SQL("INSERT INTO t ({}) VALUES ({})").format(
        sql.SQL(", ").join(map(sql.Identifier, (*KEY, *(c.name for c in COLUMNS)))),
        sql.SQL(", ").join([sql.Placeholder()] * len(KEY) + [
            sql.SQL("{}::{}").format(sql.Placeholder(), sql.SQL(c.type)) for c in COLUMNS]))
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for i, row in enumerate(rows, start=1):
            key = [i, *(values[i % len(values)] for values in KEY_VALUES)]
            conn.execute(insert, key + [_input(c, row[c.name], features) for c in COLUMNS])


def _check_paths(dsn: str, rows: list[Row]) -> None:
    features = _supported(dsn)
    _create(dsn, rows, features)
    big = {BIG_TEXT, BIG_BYTES, BIG_JSON}
    if any(_input(c, row[c.name], features) in big for row in rows for c in COLUMNS):
        assert _toasted(dsn, "t") > 0  # the big values really are stored out of line
    config = CaptureConfig(source_dsn=dsn, tables=("public.t",), slot="values", heartbeat=None,
                           snapshot=SnapshotPolicy(chunk_rows=2, incremental_chunk_rows=2))
    Capture(config).setup()  # (1) the initial snapshot
    execute(dsn, "SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in COLUMNS)
    rest = sql.SQL(", ").join(map(sql.Identifier, KEY[1:]))
    execute(dsn,  # (2) the stream: a copy of each row, then an update of each row
            sql.SQL("INSERT INTO t (id, {rest}, {names}) SELECT id + {off}, {rest}, {names} "
                    "FROM t ORDER BY id").format(rest=rest, names=names,
                                                 off=sql.Literal(COPY_OFFSET)),
            sql.SQL("UPDATE t SET c_int4 = c_int4 WHERE id < {}").format(
                sql.Literal(COPY_OFFSET)))
    capture_now(config)
    resnapshot(config, ["public.t"])  # (3) the re-snapshot
    capture_now(config)

    with ChangelogStore(dsn) as store:  # every type the decoder knows is in the table
        oids = {c.type_oid for c in store.stream_schema("public.t").columns}
    xml = {142, 143} if "xml" not in features else set()
    assert (set(_stream_schema._SCALARS) | set(_stream_schema._ARRAYS)) - oids - xml == set()

    stored = _stored_records(dsn, "public.t")
    ops: dict[int, list[str]] = {}
    for record in stored:
        ops.setdefault(int(record.key[0] or 0), []).append(record.op)
    ids = range(1, len(rows) + 1)
    assert ops == {**{i: ["r", "u", "r"] for i in ids},
                   **{i + COPY_OFFSET: ["i", "r"] for i in ids}}

    texts = _test_decoding_inserts(dsn)
    column_names = [*KEY, *(c.name for c in COLUMNS)]
    for i in ids:
        records = [r for r in stored if int(r.key[0] or 0) % COPY_OFFSET == i]
        expected = dict(zip(column_names[1:], texts[i + COPY_OFFSET][1:], strict=True))
        for record in records:  # stored text: as test_decoding prints it, key included
            assert differences(expected, dict(zip(column_names[1:], record.after[1:],
                                                  strict=True))) == {}, (i, record.op)
            assert record.key[1:] == texts[i + COPY_OFFSET][1:len(KEY)], (i, record.op)

    _check_typed(dsn, ids)


def _toasted(dsn: str, table: str) -> int:
    """How many chunks of out-of-line values the table's TOAST table holds."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT t.relname FROM pg_class c JOIN pg_class t "
                           "ON t.oid = c.reltoastrelid WHERE c.oid = %s::regclass",
                           (table,)).fetchone()
        assert row is not None
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier("pg_toast", row[0]))).fetchone()
    return int(count[0]) if count else 0


@dataclass(frozen=True)
class _Stored:
    position: int
    op: str
    key: list[str | None]
    after: list[str | None]


def _stored_records(dsn: str, stream: str) -> list[_Stored]:
    """Every record of ``stream`` as stored: changelog rows and snapshot segments, by position,
    with its key and after-image as text."""
    def texts(values: list[bytes | None]) -> list[str | None]:
        return [None if v is None else v.decode() for v in values]

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT stream_id FROM lakefold.changelog_streams WHERE name = %s",
                           (stream,)).fetchone()
        assert row is not None
        stream_id = int(row[0])
        records = [_Stored(int(p), op, texts(split_key(bytes(key))), list(after))
                   for p, op, key, after in conn.execute(
                       "SELECT position, op, key, after FROM lakefold.changelog "
                       "WHERE stream_id = %s", (stream_id,)).fetchall()]
        for segment, rows in _snapshot_segments.read_range(conn, stream_id, 1, 1 << 62, None):
            indexes = _snapshot_segments.key_indexes(conn, stream_id, segment.schema_version)
            keys = _snapshot_segments.record_keys(rows, indexes)
            for n, (key, after) in enumerate(zip(keys, rows.to_pylist(), strict=True)):
                assert key is not None
                records.append(_Stored(segment.first_position + n, "r",
                                       texts(split_key(key)), list(after.values())))
    return sorted(records, key=lambda r: r.position)


def _test_decoding_inserts(dsn: str) -> dict[int, list[str | None]]:
    """test_decoding's text of each inserted row (the streamed copies), by id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SESSION)
        lines = [r[0] for r in conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL, "
            "'skip-empty-xacts', '1')").fetchall()]
    out: dict[int, list[str | None]] = {}
    for line in lines:
        if not line.startswith("table public.t: INSERT:"):
            continue
        _table, _op, values = parse_test_decoding(line)
        for name in ("c_bit", "c_varbit"):  # test_decoding prints bit strings as B'...'
            text = values[name]
            if text is not None:
                assert text.startswith("B'") and text.endswith("'"), text
                values[name] = text[2:-1]
        out[int(values["id"] or 0)] = list(values.values())
    return out


def _check_typed(dsn: str, ids: range) -> None:
    """read_events and the Arrow read give each row's values identically on every path, equal
    to the source's (the id aside, which the copies change)."""
    source = source_values(dsn, "t", {"id": None, **{c: None for c in KEY[1:]},
                                      **{c.name: c.oracle_cast for c in COLUMNS}})
    with ChangelogStore(dsn) as store:
        schema = store.stream_schema("public.t")
        kinds = {c.name: c.kind for c in schema.columns}
        events = store.read_events("public.t", 1, 100_000)
        arrow = store.read("public.t", 1, 100_000).to_pylist()
    assert len(events) == len(arrow) == 5 * len(ids)
    for event, typed in zip(events, arrow, strict=True):
        assert event.after is not None and event.key is not None
        i = int(event.after["id"]) % COPY_OFFSET
        expected = {k: v for k, v in source[i].items() if k != "id"}
        after = {k: v for k, v in event.after.items() if k != "id"}
        assert differences(expected, after) == {}, (i, event.operation)
        key = {k: v for k, v in event.key.items() if k != "id"}
        assert differences({k: expected[k] for k in KEY[1:]}, key) == {}, (i, event.operation)
        wanted = {k: _arrow_value(kinds[k], v) for k, v in expected.items()
                  if kinds[k] in _ARROW_AS_PYTHON}
        assert differences(wanted, {k: typed[k] for k in wanted}) == {}, (i, event.operation)
    by_row: dict[int, list[dict[str, Any]]] = {}
    for typed in arrow:
        by_row.setdefault(int(typed["id"]) % COPY_OFFSET, []).append(
            {k: v for k, v in typed.items() if k != "id" and not k.startswith("_")})
    for i, versions in by_row.items():
        assert all(differences(versions[0], v) == {} for v in versions), i


# Kinds whose Arrow value is the Python value (or its text, or None where Arrow cannot hold it).
_ARROW_AS_PYTHON = frozenset({"bool", "int2", "int4", "int8", "float4", "float8", "text",
                              "enum", "other", "json", "bytea", "uuid", "date", "time",
                              "timestamp", "timestamptz", "interval"})


def _arrow_value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "uuid":
        return str(value)
    if kind == "float4":  # float32 in Arrow: the nearest float32, widened
        return struct.unpack("f", struct.pack("f", value))[0]
    if kind in ("date", "time", "timestamp", "timestamptz"):
        return None if isinstance(value, str) else value
    if kind == "interval":
        if not isinstance(value, Interval):
            return None
        return pa.scalar((value.months, value.days, value.microseconds * 1000),
                         type=pa.month_day_nano_interval()).as_py()
    return value


def test_capture_read_json_prints_snapshot_values_exactly_and_as_valid_json(pg: TestDatabase,
                                                                           ) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, b boolean, c char(4), ip inet, "
            "f float8[], n numeric(30, 9), j json, jb jsonb, i interval)",
            "INSERT INTO t VALUES (1, true, 'ab', '10.1.2.3', '{NaN,Infinity,-Infinity,1.5}', "
            "12345678901234567890.123456789, '{\"a\": 1, \"a\": 2}', '{\"x\": 1.50}', "
            "'1 year 2 days 00:00:01.5')")
    Capture(CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="cli",
                          heartbeat=None)).setup()
    cli = Path(sys.executable).parent / "lakefold"
    done = subprocess.run([cli, "capture", "read", "public.t", "--store-dsn", pg.dsn, "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    (record,) = [json.loads(line, parse_constant=refuse) for line in done.stdout.splitlines()]
    assert record["b"] is True and record["c"] == "ab  " and record["ip"] == "10.1.2.3"
    assert record["f"] == ["NaN", "Infinity", "-Infinity", 1.5]
    assert record["n"] == "12345678901234567890.123456789"
    assert record["j"] == '{"a": 1, "a": 2}' and record["jb"] == '{"x": 1.50}'
    assert record["i"] == {"months": 12, "days": 2, "nanoseconds": 1_500_000_000}
