"""pgoutput message parsing, LSNs, array literals, intervals, key encoding: no server needed.

Messages are built byte by byte from the PostgreSQL manual's "Logical Replication Message
Formats"; the same messages from a real server are checked in test_messages.py.
"""

from __future__ import annotations

import struct
from datetime import date, timedelta
from decimal import Decimal

import pytest
from hypothesis import given, strategies as st

from lakefold.capture import DecodingError, Interval, format_lsn, parse_lsn
from lakefold.capture.decoding import _pgoutput as pgo
from lakefold.store._changelog_writer import (
    Checkpoint,
    encode_key,
    split_key,
    text_array_field,
)
from lakefold.store._stream_schema import ColumnSchema, builtin_type
from lakefold.store._text_values import convert_value, parse_array, parse_interval


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def tuple_data(values: list[bytes | str | None]) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack(">i", len(value)) + value
    return out


def xid(value: int | None) -> bytes:
    return b"" if value is None else struct.pack(">I", value)


@pytest.mark.parametrize("streamed", [None, 4242])
def test_every_message_type_parses(streamed: int | None) -> None:
    in_stream = streamed is not None
    begin = pgo.parse_message(b"B" + struct.pack(">qqI", 0x1_0000_0010, 123456, 77))
    assert begin == pgo.Begin(0x1_0000_0010, 123456, 77)
    commit = pgo.parse_message(b"C" + struct.pack(">bqqq", 0, 0x10, 0x20, 99))
    assert commit == pgo.Commit(0, 0x10, 0x20, 99)
    origin = pgo.parse_message(b"O" + struct.pack(">q", 5) + cstr("upstream"))
    assert origin == pgo.Origin(5, "upstream")

    relation = pgo.parse_message(
        b"R" + xid(streamed) + struct.pack(">I", 16384) + cstr("") + cstr("orders") + b"d"
        + struct.pack(">h", 2)
        + b"\x01" + cstr("id") + struct.pack(">Ii", 20, -1)
        + b"\x00" + cstr("amount") + struct.pack(">Ii", 1700, (12 << 16 | 2) + 4),
        in_stream=in_stream)
    assert isinstance(relation, pgo.Relation)
    assert relation.namespace == "pg_catalog"  # empty namespace means pg_catalog
    assert relation.xid == streamed and relation.replica_identity == "d"
    assert [(c.key, c.name, c.type_oid) for c in relation.columns] == [
        (True, "id", 20), (False, "amount", 1700)]

    typ = pgo.parse_message(b"Y" + xid(streamed) + struct.pack(">I", 50000) + cstr("public")
                            + cstr("mood"), in_stream=in_stream)
    assert typ == pgo.Type(streamed, 50000, "public", "mood")

    insert = pgo.parse_message(b"I" + xid(streamed) + struct.pack(">I", 16384) + b"N"
                               + tuple_data([b"1", None]), in_stream=in_stream)
    assert insert == pgo.Insert(streamed, 16384, (b"1", None))

    plain = pgo.parse_message(b"U" + xid(streamed) + struct.pack(">I", 16384) + b"N"
                              + tuple_data([b"1", "u"]), in_stream=in_stream)
    assert plain == pgo.Update(streamed, 16384, None, None, (b"1", pgo.UNCHANGED_TOAST))
    for marker in ("K", "O"):
        update = pgo.parse_message(
            b"U" + xid(streamed) + struct.pack(">I", 16384) + marker.encode()
            + tuple_data([b"1", None]) + b"N" + tuple_data([b"2", b"x"]), in_stream=in_stream)
        assert update == pgo.Update(streamed, 16384, marker, (b"1", None), (b"2", b"x"))
        delete = pgo.parse_message(b"D" + xid(streamed) + struct.pack(">I", 16384)
                                   + marker.encode() + tuple_data([b"7", None]),
                                   in_stream=in_stream)
        assert delete == pgo.Delete(streamed, 16384, marker, (b"7", None))

    truncate = pgo.parse_message(b"T" + xid(streamed) + struct.pack(">ib", 2, 3)
                                 + struct.pack(">II", 10, 11), in_stream=in_stream)
    assert truncate == pgo.Truncate(streamed, 3, (10, 11))

    message = pgo.parse_message(b"M" + xid(streamed) + b"\x01" + struct.pack(">q", 0x99)
                                + cstr("app") + struct.pack(">i", 3) + b"abc",
                                in_stream=in_stream)
    assert message == pgo.Message(streamed, True, 0x99, "app", b"abc")

    assert pgo.parse_message(b"S" + struct.pack(">Ib", 9, 1)) == pgo.StreamStart(9, True)
    assert pgo.parse_message(b"E") == pgo.StreamStop()
    assert pgo.parse_message(b"c" + struct.pack(">Ibqqq", 9, 0, 0x30, 0x40, 5)) == \
        pgo.StreamCommit(9, 0, 0x30, 0x40, 5)
    assert pgo.parse_message(b"A" + struct.pack(">II", 9, 12)) == pgo.StreamAbort(9, 12)


def test_unknown_and_truncated_messages_raise_decoding_errors() -> None:
    with pytest.raises(DecodingError, match="unknown pgoutput message type 'Z'"):
        pgo.parse_message(b"Z")
    with pytest.raises(DecodingError, match="malformed"):
        pgo.parse_message(b"B" + b"\x00" * 5)
    with pytest.raises(DecodingError, match="unknown tuple column kind"):
        pgo.parse_message(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"q")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_text_round_trip(lsn: int) -> None:
    text = format_lsn(lsn)
    assert parse_lsn(text) == lsn
    assert text == text.upper()


@pytest.mark.parametrize("bad", ["", "16B3748", "0/", "/1", "x/y"])
def test_parse_lsn_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_lsn(bad)


_values = st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=12)


@given(_values)
def test_tuple_data_round_trip(values: list[bytes | None]) -> None:
    decoded, end = pgo.read_tuple(tuple_data(list(values)), 0)
    assert list(decoded) == values
    assert end == len(tuple_data(list(values)))


@given(_values)
def test_text_array_field_and_keys_round_trip(values: list[bytes | None]) -> None:
    parts = [b"\xff\xff\xff\xff" if v is None else struct.pack(">i", len(v)) + v for v in values]
    field = text_array_field(parts)
    (length,) = struct.unpack_from(">i", field)
    assert length == len(field) - 4
    from lakefold.store._changelog_writer import decode_text_array_field

    assert decode_text_array_field(field[4:]) == values
    texts = [None if v is None else v.hex() for v in values]
    assert split_key(encode_key(texts)) == [None if t is None else t.encode() for t in texts]


def _array_literal(items: list[object]) -> str:
    def element(item: object) -> str:
        if item is None:
            return "NULL"
        if isinstance(item, list):
            return _array_literal(item)
        text = str(item)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join(element(i) for i in items) + "}"


@given(st.lists(st.one_of(st.none(), st.text(max_size=10)), max_size=8))
def test_array_literal_parses_what_postgres_prints(items: list[str | None]) -> None:
    assert parse_array(_array_literal(list(items))) == items


def test_array_literal_forms() -> None:
    assert parse_array("{}") == []
    assert parse_array("{1,2,NULL}") == ["1", "2", None]
    assert parse_array('{"a b","NULL",null}') == ["a b", "NULL", None]
    assert parse_array("{{1,2},{3,4}}") == [["1", "2"], ["3", "4"]]
    assert parse_array("[0:1]={7,8}") == ["7", "8"]
    assert parse_array('{"\\\\x01","a\\"b"}') == ["\\x01", 'a"b']


@pytest.mark.parametrize(("text", "expected"), [
    ("PT0S", Interval(0, 0, 0)),
    ("P1Y2M3DT4H5M6.5S", Interval(14, 3, 14_706_500_000)),
    ("P-1Y-2M3DT-4H-5M-6S", Interval(-14, 3, -14_706_000_000)),
    ("PT-0.000001S", Interval(0, 0, -1)),
    ("P2W", Interval(0, 14, 0)),
    ("infinity", "infinity"),
])
def test_interval_iso_8601(text: str, expected: object) -> None:
    assert parse_interval(text) == expected


def test_interval_to_timedelta() -> None:
    assert Interval(0, 2, 5).to_timedelta() == timedelta(days=2, microseconds=5)
    with pytest.raises(ValueError, match="months"):
        Interval(1, 0, 0).to_timedelta()


def _column(oid: int, typmod: int = -1) -> ColumnSchema:
    info = builtin_type(oid)
    assert info is not None
    return ColumnSchema("c", oid, info.type_name, typmod, False, info.kind, info.element_kind)


def test_special_values_are_kept_exact() -> None:
    assert convert_value(_column(1082), "infinity") == "infinity"
    assert convert_value(_column(1082), "0044-03-15 BC") == "0044-03-15 BC"
    assert convert_value(_column(1082), "2024-02-29") == date(2024, 2, 29)
    assert convert_value(_column(1083), "24:00:00") == "24:00:00"
    assert convert_value(_column(1700), "NaN").is_nan()
    assert convert_value(_column(1700), "-Infinity") == Decimal("-Infinity")
    assert convert_value(_column(1231), "{1.5,NULL}") == [Decimal("1.5"), None]
    assert _column(1700, (12 << 16 | 2) + 4).numeric_precision_scale == (12, 2)
    assert _column(1700).numeric_precision_scale is None


def test_checkpoint_covers_records_by_commit_lsn_and_ordinal() -> None:
    partial = Checkpoint(commit_lsn=100, ordinal=5, complete=False)
    assert partial.covers(99, 1_000)
    assert partial.covers(100, 5)
    assert not partial.covers(100, 6)
    assert not partial.covers(101, 1)
    assert Checkpoint(100, 5, complete=True).covers(100, 6)
