"""Derived streams: rows a view writes read back as the same typed values, through every
reader of a captured table's stream (ranges, states), with positions, heads and versions."""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.capture import ChangelogStore, read_changelog_range
from lakefold.projections.state._stream_state import LatestRows
from lakefold.store._derived_streams import DerivedStream, column_for
from lakefold.store.exceptions import CaptureValueError, OwnershipError, StoreError
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)

_STREAMS = itertools.count()
_SCHEMA = pa.schema([
    pa.field("id", pa.int64()), pa.field("small", pa.int16()), pa.field("n", pa.int32()),
    pa.field("f", pa.float64()), pa.field("g", pa.float32()),
    pa.field("amount", pa.decimal128(12, 3)), pa.field("name", pa.string()),
    pa.field("ok", pa.bool_()), pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("local", pa.timestamp("us")),
])
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                max_size=12)
_AT = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
_row = st.fixed_dictionaries({
    "small": st.none() | st.integers(-(2**15), 2**15 - 1),
    "n": st.none() | st.integers(-(2**31), 2**31 - 1),
    "f": st.none() | st.floats(allow_nan=False, width=64),
    "g": st.none() | st.floats(allow_nan=False, width=32),
    "amount": st.none() | st.decimals(min_value=-10**8, max_value=10**8, places=3,
                                      allow_nan=False, allow_infinity=False),
    "name": st.none() | _TEXT,
    "ok": st.none() | st.booleans(),
    "day": st.none() | st.dates(min_value=dt.date(1, 1, 1)),
    "at": st.none() | _AT.map(lambda t: t.replace(tzinfo=dt.UTC)),
    "local": st.none() | _AT,
})


@pytest.fixture
def store(pg: TestDatabase) -> str:
    with ChangelogStore(pg.dsn) as changelog:
        changelog.install()
    return pg.dsn


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=_SCHEMA)


def _data(table: pa.Table) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = table.drop_columns(
        [c for c in table.column_names if c.startswith("_")]).to_pylist()
    return data


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(_row, min_size=1, max_size=8))
def test_values_read_back_as_written(store: str, rows: list[dict[str, Any]]) -> None:
    stream = DerivedStream(f"views.roundtrip_{next(_STREAMS)}")  # a new stream per example
    written = _table([{"id": i, **row} for i, row in enumerate(rows)])
    with psycopg.connect(store, autocommit=True) as conn:
        schema = stream.create(conn, _SCHEMA, ["id"])
        start, end = stream.append(conn, schema, upserts=written, old=_SCHEMA.empty_table(),
                                   deletes=_SCHEMA.empty_table(), commit_lsn=7,
                                   commit_ts=dt.datetime.now(dt.UTC))
    assert (start, end) == (1, len(rows) + 1)
    read = pa.Table.from_batches(read_changelog_range(store, stream.name, start, end))
    assert _data(read) == written.to_pylist()
    assert read.schema.field("amount").type == pa.decimal128(12, 3)


def test_updates_and_deletes_reach_a_state_like_a_captured_tables(store: str) -> None:
    stream = DerivedStream("views.lines")
    now = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
    a = {"id": 1, "name": "a", "amount": Decimal("1.500")}
    b = {"id": 2, "name": "b", "amount": None}
    with psycopg.connect(store, autocommit=True) as conn:
        schema = stream.create(conn, _SCHEMA, ["id"])
        assert stream.create(conn, _SCHEMA, ["id"]).version == schema.version == 1
        stream.append(conn, schema, upserts=_table([a, b]), old=_table([{}, {}]),
                      deletes=_SCHEMA.empty_table(), commit_lsn=1, commit_ts=now)
        state = LatestRows("reader", stream.name)
        state.create(conn, lookups=["name"])
        state.apply(conn, 2**62)
        a2 = {**a, "name": "z"}
        with conn.transaction():
            stream.append(conn, schema, upserts=_table([a2]), old=_table([a]),
                          deletes=_table([b]), commit_lsn=2, commit_ts=now)
        changes = state.apply(conn, 2**62)
        assert [r["name"] for r in _data(state.typed(conn, changes.before))] == ["a", "b"]
        assert _data(state.typed(conn, state.rows(conn))) == _data(_table([a2]))
        ops = read_ops(store, stream.name)
        assert ops == ["insert", "insert", "update", "delete"]
        with ChangelogStore(store) as changelog:
            assert changelog.head(stream.name) == 4
            events = changelog.read_events(stream.name, 3, 10)
            assert events[0].before is not None and events[0].before["name"] == "a"
            assert events[1].operation == "delete" and events[1].key == {"id": 2}
        wider = _SCHEMA.append(pa.field("extra", pa.int64()))
        assert stream.create(conn, wider, ["id"]).version == 2


def read_ops(dsn: str, stream: str) -> list[str]:
    read = pa.Table.from_batches(read_changelog_range(dsn, stream, 1, 100))
    ops: list[str] = read.column("_op").to_pylist()
    return ops


def test_a_transaction_that_rolls_back_leaves_no_record(store: str) -> None:
    stream = DerivedStream("views.rolled")
    with psycopg.connect(store, autocommit=True) as conn:
        schema = stream.create(conn, _SCHEMA, ["id"])
        with pytest.raises(RuntimeError), conn.transaction():
            stream.append(conn, schema, upserts=_table([{"id": 1}]), old=_table([{}]),
                          deletes=_SCHEMA.empty_table(), commit_lsn=1,
                          commit_ts=dt.datetime.now(dt.UTC))
            raise RuntimeError("the view's batch failed after writing")
    with ChangelogStore(store) as changelog:
        assert changelog.head(stream.name) == 0


def test_bad_streams_and_types_are_refused(store: str) -> None:
    with pytest.raises(CaptureValueError, match="'tags' has type list<item: string>"):
        column_for(pa.field("tags", pa.list_(pa.string())), key=False)
    with psycopg.connect(store, autocommit=True) as conn:
        with pytest.raises(StoreError, match=r"lacks \['nope'\]"):
            DerivedStream("views.x").create(conn, _SCHEMA, ["nope"])
        conn.execute("INSERT INTO lakefold.changelog_streams (name, slot_name, "
                     "source_database, source_schema, source_table) "
                     "VALUES ('public.orders', 'capture_slot', 'db', 'public', 'orders')")
        with pytest.raises(OwnershipError, match="a view cannot write it"):
            DerivedStream("public.orders").create(conn, _SCHEMA, ["id"])
