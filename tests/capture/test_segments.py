"""Snapshot segments: the initial snapshot stores its chunks as a few compressed rows
(``lakefold.changelog_segments``), and every reader sees the same records it would see as
changelog rows: the values a streamed insert of the same row carries, any window of positions,
merged in order with the streamed records around them, and compaction turns them into rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    SnapshotPolicy,
    read_changelog_range,
)
from lakefold.capture.exceptions import StoreError
from lakefold.capture.snapshots import _initial_snapshot
from lakefold.store import _snapshot_segments
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)

_COLUMNS = ("(id int PRIMARY KEY, t text, n numeric(12, 3), ts timestamptz, b bytea, "
            "j jsonb, a text[], f float8, d date)")
# Text forms that need care in any row format: tab, newline, CR, backslash, quotes, comma,
# the empty string next to NULL, a NULL-looking string, non-ASCII.
_TEXTS = ("plain", "tab\there", "line\nbreak", "cr\rhere", "back\\slash", "\"quoted\"",
          "a,b", "", None, "\\N", "NULL", "ünïcödé ✓", "   ")


def _seed(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, text in enumerate(_TEXTS * 3, start=1):
            conn.execute(sql.SQL(
                "INSERT INTO {} VALUES (%s, %s, %s / 7.0, '2024-02-29 23:59:59.5+05'::"
                "timestamptz + %s * interval '1 day', %s, %s, %s, %s / 3.0, "
                "'2024-01-01'::date + %s)").format(sql.Identifier(table)),
                (i, text, i, i, (text or "").encode(), f'{{"i": {i}, "t": "x"}}',
                 [text, None, "e"], i, i))


def _data(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in table.column_names if c.startswith("_")])


def _stream_id(dsn: str, stream: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT stream_id FROM lakefold.changelog_streams WHERE name = %s",
                           (stream,)).fetchone()
    assert row is not None
    return int(row[0])


def _storage(dsn: str, stream_id: int) -> tuple[int, int]:
    """(changelog rows, segments) of the stream."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM lakefold.changelog WHERE stream_id = %(s)s), "
            "(SELECT count(*) FROM lakefold.changelog_segments WHERE stream_id = %(s)s)",
            {"s": stream_id}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_snapshot_records_in_segments_read_like_streamed_inserts_of_the_same_rows(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE snapped " + _COLUMNS, "CREATE TABLE streamed " + _COLUMNS)
    _seed(pg.dsn, "snapped")
    rows = 3 * len(_TEXTS)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("snapped", "streamed"), slot="segs",
                           snapshot=SnapshotPolicy(chunk_rows=7, workers=2))
    Capture(config).setup()
    _seed(pg.dsn, "streamed")  # the same rows, as inserts through the stream
    capture_now(config)

    snapped = _stream_id(pg.dsn, "public.snapped")
    assert _storage(pg.dsn, snapped) == (0, -(-rows // 7))  # no row per record: segments
    with ChangelogStore(pg.dsn) as store:
        full = store.read("public.snapped", 1, 1_000)
        assert full.column("_position").to_pylist() == list(range(1, rows + 1))
        assert full.column("_ordinal").to_pylist() == list(range(1, rows + 1))
        assert set(full.column("_op").to_pylist()) == {"read"}
        assert set(full.column("_xid").to_pylist()) == {0}
        assert _data(full) == _data(store.read("public.streamed", 1, 1_000))
        events = store.read_events("public.snapped", 1, 1_000)
        twins = store.read_events("public.streamed", 1, 1_000)
        assert [(e.position, e.key, e.after, e.before, e.schema_version) for e in events] == [
            (t.position, t.key, t.after, t.before, t.schema_version) for t in twins]
        assert [e.after["t"] for e in events if e.after] == list(_TEXTS * 3)
        # any window: across segment boundaries, inside one, at the end
        for start, limit in ((1, 3), (5, 7), (6, 20), (14, 1), (rows - 2, 10), (rows + 1, 5)):
            window = store.read("public.snapped", start, limit)
            assert window == full.slice(start - 1, limit), (start, limit)
            assert [e.position for e in store.read_events("public.snapped", start, limit)] == \
                window.column("_position").to_pylist()
        batches = list(read_changelog_range(pg.dsn, "public.snapped", 3, 31, batch_rows=4))
        assert pa.Table.from_batches(batches) == full.slice(2, 28)
        assert replayed_rows(store, "public.snapped") == source_rows(pg.dsn, "public.snapped")


def test_streamed_changes_follow_the_segments_and_compaction_turns_them_into_rows(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE items " + _COLUMNS)
    _seed(pg.dsn, "items")
    rows = 3 * len(_TEXTS)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("items",), slot="segcompact",
                           snapshot=SnapshotPolicy(chunk_rows=5))
    Capture(config).setup()
    execute(pg.dsn, "UPDATE items SET t = 'changed' WHERE id % 4 = 0",
            "DELETE FROM items WHERE id % 9 = 0", "INSERT INTO items (id, t) VALUES (1000, 'new')")
    capture_now(config)
    stream_id = _stream_id(pg.dsn, "public.items")
    with ChangelogStore(pg.dsn) as store:
        before = store.read("public.items", 1, 1_000)
        ops = before.column("_op").to_pylist()
        assert ops[:rows] == ["read"] * rows and "read" not in ops[rows:]
        assert before.column("_position").to_pylist() == list(range(1, len(ops) + 1))
        untouched = [i for i in range(1, rows + 1) if i % 4 and i % 9]
        events = {e.position: e for e in store.read_events("public.items", 1, 1_000)}

        store.compact("public.items", tombstone_retention=timedelta(0))
        assert _storage(pg.dsn, stream_id)[1] == 0  # every segment became rows
        after = store.read("public.items", 1, 1_000)
        kept = after.filter(pa.compute.equal(after.column("_op"), "read"))
        # the untouched rows' reads stay exactly as they were (positions, values, metadata)
        assert kept == before.take([i - 1 for i in untouched])
        assert [events[i] for i in untouched] == [  # keys, images and metadata alike
            e for e in store.read_events("public.items", 1, 1_000) if e.operation == "read"]
        assert replayed_rows(store, "public.items") == source_rows(pg.dsn, "public.items")
        assert len(after) == len(source_rows(pg.dsn, "public.items"))  # one record per key


def test_reading_a_store_installed_before_segments_says_how_to_upgrade(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE old (id int PRIMARY KEY, v text)",
            "INSERT INTO old VALUES (1, 'a')")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("old",), slot="oldstore")
    Capture(config).setup()
    execute(pg.dsn, "DROP TABLE lakefold.changelog_segments")  # as an older version left it
    with ChangelogStore(pg.dsn) as store:
        with pytest.raises(StoreError, match=r"older lakefold.*install\(\)"):
            store.read("public.old")
        store.install()
        assert store.read("public.old").num_rows == 0  # its segment went with the table
        execute(pg.dsn, "INSERT INTO old VALUES (2, 'b')")
        capture_now(config)
        assert [e.after for e in store.read_events("public.old")] == [{"id": 2, "v": "b"}]


def test_a_chunk_larger_than_a_segment_is_split_into_contiguous_segments(
        pg: TestDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_initial_snapshot, "_SEGMENT_BYTES", 32 << 10)  # 32 kB instead of 32 MB
    execute(pg.dsn, "CREATE TABLE wide (id int PRIMARY KEY, body text)",
            "INSERT INTO wide SELECT g, repeat(md5(g::text), 30) FROM generate_series(1, 400) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("wide",), slot="split",
                           snapshot=SnapshotPolicy(chunk_rows=200, workers=2))
    Capture(config).setup()
    with psycopg.connect(pg.dsn) as conn:
        spans = conn.execute("SELECT first_position, last_position, first_ordinal "
                             "FROM lakefold.changelog_segments ORDER BY 1").fetchall()
    assert len(spans) > 4  # two chunks of ~200 kB, each cut into several segments
    assert [s[0] for s in spans] == [1] + [s[1] + 1 for s in spans[:-1]]  # no gap, no overlap
    assert spans[-1][1] == 400 and all(s[0] == s[2] for s in spans)
    with ChangelogStore(pg.dsn) as store:
        table = store.read("public.wide", 1, 1_000)
        assert table.column("_ordinal").to_pylist() == list(range(1, 401))
        assert replayed_rows(store, "public.wide") == source_rows(pg.dsn, "public.wide")




@pytest.mark.parametrize("reader", ["read", "read_events"])
def test_a_read_that_compaction_overtakes_still_sees_every_record_once(
        pg: TestDatabase, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    execute(pg.dsn, "CREATE TABLE race (id int PRIMARY KEY, v text)",
            "INSERT INTO race SELECT g, 'v' || g FROM generate_series(1, 50) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("race",), slot="race",
                           snapshot=SnapshotPolicy(chunk_rows=10))
    Capture(config).setup()
    stream_id = _stream_id(pg.dsn, "public.race")
    assert _storage(pg.dsn, stream_id) == (0, 5)
    read_segments = _snapshot_segments.read_range

    def compacted_first(*args: Any, **kwargs: Any) -> Iterator[Any]:
        # between the read's rows and its segments, compaction turns the segments into rows
        with ChangelogStore(pg.dsn) as other:
            other.compact("public.race", tombstone_retention=timedelta(0))
        yield from read_segments(*args, **kwargs)

    monkeypatch.setattr(_snapshot_segments, "read_range", compacted_first)
    with ChangelogStore(pg.dsn) as store:
        if reader == "read":
            positions = store.read("public.race", 1, 100).column("_position").to_pylist()
        else:
            positions = [e.position for e in store.read_events("public.race", 1, 100)]
    assert positions == list(range(1, 51))
    assert _storage(pg.dsn, stream_id) == (50, 0)  # compaction did run in between
