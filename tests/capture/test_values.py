"""Every data type, value by value, cross-checked against PostgreSQL's own test_decoding output
for the same WAL: the text stored in the changelog equals what test_decoding prints, and the
typed values (Python and Arrow) are the expected ones."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from lakefold.capture import CaptureConfig, ChangelogStore, Interval
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)

DDL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE alltypes (
  id int PRIMARY KEY,
  c_int2 smallint, c_int4 integer, c_int8 bigint,
  c_numeric numeric, c_numeric_ps numeric(12, 3),
  c_float4 real, c_float8 double precision,
  c_text text, c_varchar varchar(20), c_char char(5),
  c_bool boolean, c_date date, c_time time, c_timestamp timestamp, c_timestamptz timestamptz,
  c_interval interval, c_uuid uuid, c_json json, c_jsonb jsonb, c_bytea bytea,
  c_int_arr int[], c_text_arr text[], c_num_arr numeric[], c_tstz_arr timestamptz[],
  c_bool_arr boolean[], c_jsonb_arr jsonb[], c_date_arr date[],
  c_enum mood, c_enum_arr mood[], c_domain posint,
  c_inet inet, c_point point, c_timetz timetz
);
"""

ROWS = [
    """(1, 1, 2, 3, 1.5, 2.25, 1.25, 2.5, 'plain', 'vc', 'ab', true, '2024-02-29',
        '13:14:15.123456', '2024-02-29 13:14:15.5', '2024-06-01 12:00:00+05:30',
        '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '{"b": 1,  "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', '\\x00ff10',
        '{1,2,NULL}', '{"a b","c,d",NULL,"q\\"t"}', '{1.1,NULL}',
        '{"2024-01-01 00:00:00+00"}', '{t,f}', ARRAY['{"k": 1}'::jsonb], '{2024-01-02}',
        'happy', '{sad,happy}', 7, '192.168.0.1/24', '(1,2)', '12:00:00+02')""",
    "(2" + ", NULL" * 33 + ")",
    """(3, -32768, -2147483648, -9223372036854775808,
        '-123456789012345678901234567890.123456789', 'NaN', 'Infinity', '-Infinity',
        E'quote '' back\\\\slash tab\\t nl\\n uni \u00e9\u20ac\U0001F600', '', 'x', false,
        'infinity', '24:00:00', '-infinity', '1970-01-01 00:00:00+00', '-1 days -00:00:01',
        '00000000-0000-0000-0000-000000000000', '[]', '{}', '\\x', '{{1,2},{3,4}}', '{}',
        '{NaN}', '{}', '{}', '{}', '{infinity}', 'sad', '{}', 1, '::1', '(0,-1.5)',
        '00:00:00-10')""",
]

EXPECTED: dict[int, dict[str, Any]] = {
    1: {
        "c_int2": 1, "c_int4": 2, "c_int8": 3, "c_numeric": Decimal("1.5"),
        "c_numeric_ps": Decimal("2.250"), "c_float4": 1.25, "c_float8": 2.5,
        "c_text": "plain", "c_varchar": "vc", "c_char": "ab   ", "c_bool": True,
        "c_date": date(2024, 2, 29), "c_time": time(13, 14, 15, 123456),
        "c_timestamp": datetime(2024, 2, 29, 13, 14, 15, 500000),
        "c_timestamptz": datetime(2024, 6, 1, 6, 30, tzinfo=UTC),
        "c_interval": Interval(14, 3, 14_706_789_000),
        "c_uuid": uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        "c_json": '{"b": 1,  "a": [1, 2]}', "c_jsonb": {"a": [1, 2], "b": 1},
        "c_bytea": b"\x00\xff\x10", "c_int_arr": [1, 2, None],
        "c_text_arr": ["a b", "c,d", None, 'q"t'], "c_num_arr": [Decimal("1.1"), None],
        "c_tstz_arr": [datetime(2024, 1, 1, tzinfo=UTC)], "c_bool_arr": [True, False],
        "c_jsonb_arr": [{"k": 1}], "c_date_arr": [date(2024, 1, 2)], "c_enum": "happy",
        "c_enum_arr": ["sad", "happy"], "c_domain": 7, "c_inet": "192.168.0.1/24",
        "c_point": "(1,2)", "c_timetz": "12:00:00+02",
    },
    3: {
        "c_int2": -32768, "c_int4": -2147483648, "c_int8": -9223372036854775808,
        "c_numeric": Decimal("-123456789012345678901234567890.123456789"),
        "c_float8": float("-inf"),
        "c_text": "quote ' back\\slash tab\t nl\n uni \u00e9\u20ac\U0001F600",
        "c_varchar": "", "c_char": "x    ", "c_bool": False, "c_date": "infinity",
        "c_time": "24:00:00", "c_timestamp": "-infinity",
        "c_timestamptz": datetime(1970, 1, 1, tzinfo=UTC),
        "c_interval": Interval(0, -1, -1_000_000),
        "c_uuid": uuid.UUID(int=0), "c_json": "[]", "c_jsonb": {}, "c_bytea": b"",
        "c_int_arr": [[1, 2], [3, 4]], "c_text_arr": [], "c_date_arr": ["infinity"],
        "c_enum": "sad", "c_enum_arr": [], "c_domain": 1, "c_inet": "::1",
        "c_point": "(0,-1.5)", "c_timetz": "00:00:00-10",
    },
}

SESSION = ("SET datestyle = 'ISO, YMD'; SET intervalstyle = iso_8601; SET timezone = 'UTC'; "
           "SET extra_float_digits = 1; SET bytea_output = hex")


def parse_test_decoding(line: str) -> tuple[str, str, dict[str, str | None]]:
    """``table public.t: INSERT: id[integer]:1 c[text]:'x'`` -> (table, op, {col: text})."""
    head, _, rest = line.partition(": ")
    op, _, rest = rest.partition(": ")
    values: dict[str, str | None] = {}
    pos = 0
    while pos < len(rest):
        bracket = rest.index("[", pos)
        name = rest[pos:bracket]
        end = rest.index("]:", bracket)
        pos = end + 2
        if rest.startswith("null", pos) and (pos + 4 == len(rest) or rest[pos + 4] == " "):
            values[name] = None
            pos += 5
        elif rest[pos] == "'":
            chars = []
            pos += 1
            while True:
                if rest[pos] == "'":
                    if pos + 1 < len(rest) and rest[pos + 1] == "'":
                        chars.append("'")
                        pos += 2
                        continue
                    pos += 2  # closing quote and the space
                    break
                chars.append(rest[pos])
                pos += 1
            values[name] = "".join(chars)
        else:
            token_end = rest.find(" ", pos)
            token_end = len(rest) if token_end < 0 else token_end
            token = rest[pos:token_end]
            values[name] = {"true": "t", "false": "f"}.get(token, token)
            pos = token_end + 1
    return head.removeprefix("table "), op, values


def test_every_type_value_by_value_matches_test_decoding(pg: TestDatabase) -> None:
    execute(pg.dsn, DDL)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.alltypes",), slot="values")
    from lakefold.capture import Capture

    Capture(config).setup()
    execute(pg.dsn, "SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    for row in ROWS:
        execute(pg.dsn, "INSERT INTO alltypes VALUES " + row)
    capture_now(config)

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(SESSION)
        lines = [r[0] for r in conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL, "
            "'skip-empty-xacts', '1')").fetchall()]
        stored = conn.execute(
            "SELECT after FROM lakefold.changelog ORDER BY position").fetchall()
    # The store lives in the same database: skip test_decoding's lines for lakefold's own tables.
    changes = [parse_test_decoding(line) for line in lines if line.startswith("table public.")]
    assert len(changes) == len(ROWS) == len(stored)
    with ChangelogStore(pg.dsn) as store:
        check_store(store, changes, stored)


def check_store(store: ChangelogStore, changes: list[Any], stored: list[Any]) -> None:
    schema = store.stream_schema("public.alltypes")
    names = list(schema.column_names)
    for (table, op, expected_text), (after,) in zip(changes, stored, strict=True):
        assert (table, op) == ("public.alltypes", "INSERT")
        assert list(expected_text) == names
        assert dict(zip(names, after, strict=True)) == expected_text  # text, exactly

    events = {e.after["id"]: e.after for e in store.read_events("public.alltypes") if e.after}
    for row_id, expected in EXPECTED.items():
        for name, value in expected.items():
            assert events[row_id][name] == value, name
    assert events[3]["c_numeric_ps"].is_nan()
    assert events[3]["c_float4"] == float("inf")
    assert events[3]["c_num_arr"][0].is_nan()
    assert all(v is None for k, v in events[2].items() if k != "id")
    assert json.loads(json.dumps(events[1]["c_jsonb"])) == {"a": [1, 2], "b": 1}

    kinds = {c.name: (c.kind, c.element_kind, c.type_name, c.key) for c in schema.columns}
    assert kinds["id"] == ("int4", None, "int4", True)
    assert kinds["c_enum"] == ("enum", None, "public.mood", False)
    assert kinds["c_enum_arr"] == ("array", "enum", "public.mood[]", False)
    assert kinds["c_domain"] == ("int4", None, "public.posint", False)
    assert kinds["c_point"] == ("other", None, "point", False)

    table = store.read("public.alltypes")
    types = {f.name: f.type for f in table.schema}
    assert types["c_numeric_ps"] == pa.decimal128(12, 3)
    assert types["c_numeric"] == pa.string()  # unconstrained numeric: exact text
    assert types["c_interval"] == pa.month_day_nano_interval()
    assert types["c_int_arr"] == pa.list_(pa.int32())
    assert types["c_timestamptz"] == pa.timestamp("us", tz="UTC")
    rows = {r["id"]: r for r in table.to_pylist()}
    first = rows[1]
    for name in ("c_int8", "c_numeric_ps", "c_float8", "c_text", "c_bool", "c_date", "c_time",
                 "c_timestamp", "c_timestamptz", "c_bytea", "c_int_arr", "c_enum_arr",
                 "c_date_arr", "c_domain"):
        assert first[name] == EXPECTED[1][name], name
    assert first["c_uuid"] == str(EXPECTED[1]["c_uuid"])
    assert first["c_numeric"] == "1.5"
    interval = first["c_interval"]
    assert (interval.months, interval.days, interval.nanoseconds) == (14, 3, 14_706_789_000_000)
    # values Arrow cannot hold become null there, and stay exact in read_events
    assert rows[3]["c_date"] is None and rows[3]["c_numeric_ps"] is None
    assert rows[3]["c_int_arr"] == [1, 2, 3, 4]  # multi-dimensional arrays are flattened
    assert rows[3]["c_float8"] == float("-inf")
    assert all(v is None for k, v in rows[2].items() if not k.startswith("_") and k != "id")


def test_booleans_read_in_both_text_forms_and_refuse_any_other() -> None:
    """Records stored by snapshots of earlier lakefold versions hold ``true``/``false`` (the
    cast's text) where the stream holds ``t``/``f``: both read right; other text is refused,
    never read as False."""
    from lakefold.store._arrow_columns import typed_array
    from lakefold.store._stream_schema import ColumnSchema
    from lakefold.store._text_values import convert_value

    column = ColumnSchema(name="b", type_oid=16, type_name="bool", type_modifier=-1, key=False,
                          kind="bool")
    texts = ["t", "f", "true", "false", None]
    assert [convert_value(column, t) for t in texts] == [True, False, True, False, None]
    assert typed_array(column, pa.array(texts)).to_pylist() == [True, False, True, False, None]
    for bad in ("x", "True", ""):
        with pytest.raises(ValueError, match="not a boolean"):
            convert_value(column, bad)
        with pytest.raises(ValueError, match="not a boolean"):
            typed_array(column, pa.array(["t", bad, None]))
