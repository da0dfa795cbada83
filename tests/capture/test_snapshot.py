"""The initial snapshot: consistent with the slot (no gap, no duplicate at the hand-over even
with writes running throughout), chunked, and written with the stream schema."""

from __future__ import annotations

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore, SnapshotPolicy
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.capture.snapshot_helpers import (
    Writer,
    assert_valid_histories,
    key_histories,
    seed_table,
)
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)


def test_handover_under_concurrent_writes_has_no_gap_and_no_duplicate(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 30_000)
    writer = Writer(pg.dsn, "items", start_id=30_001, seed=7)
    writer.start()
    config = CaptureConfig(source_dsn=pg.dsn, tables=("items",), slot="snap",
                           snapshot=SnapshotPolicy(chunk_rows=2_000))
    try:
        Capture(config).setup()  # creates the slot and copies the table inside its snapshot
        started = writer.transactions
        capture_now(config)
    finally:
        writer.stop()
    assert writer.transactions > started  # writes ran during the snapshot and the stream
    capture_now(config)

    with ChangelogStore(pg.dsn) as store:
        histories = key_histories(store, "public.items")
        assert_valid_histories(histories)
        reads = [k for k, ops in histories.items() if "read" in ops]
        assert all(histories[k].count("read") == 1 for k in reads)
        # every read precedes every change: the reads are the table at the slot's start
        ops = store.read("public.items", 1, 1_000_000).column("_op").to_pylist()
        first_change = next(i for i, op in enumerate(ops) if op != "read")
        assert set(ops[:first_change]) == {"read"}
        assert "read" not in ops[first_change:]
        assert len(reads) == first_change >= 29_000
        assert replayed_rows(store, "public.items") == source_rows(pg.dsn, "public.items")
        schema = store.stream_schema("public.items")
        assert schema.version == 1  # the Relation messages matched the snapshot's schema
        assert schema.key_columns == ("id",)
    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute(
            "SELECT s.status, sum(t.chunks), sum(t.rows) FROM lakefold.capture_snapshots s "
            "JOIN lakefold.capture_snapshot_tables t USING (snapshot_id) GROUP BY 1").fetchone()
    assert row is not None and row[0] == "done"
    assert row[1] >= 15 and row[2] == len(reads)


def test_snapshot_of_many_tables_types_and_partitions(pg: TestDatabase) -> None:
    execute(pg.dsn,
            "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
            "CREATE TABLE kinds (a int, b text, c timestamptz, d numeric(12, 3), e jsonb, "
            "f bytea, g mood, h int[], i interval, j float8, k uuid, "
            "PRIMARY KEY (b, a))",
            "INSERT INTO kinds SELECT g, 'k' || (g % 7), '2024-01-02 03:04:05+02'::timestamptz "
            "+ g * interval '1 hour', g / 7.0, jsonb_build_object('g', g), "
            "decode(md5(g::text), 'hex'), 'ok', ARRAY[g, NULL], g * interval '1 minute', "
            "g / 3.0, md5(g::text)::uuid FROM generate_series(1, 500) g",
            "CREATE TABLE parted (id int, region text, v int, PRIMARY KEY (region, id)) "
            "PARTITION BY LIST (region)",
            "CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')",
            "CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')",
            "INSERT INTO parted SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g "
            "FROM generate_series(1, 300) g",
            "CREATE TABLE empty_one (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="many",
                           snapshot=SnapshotPolicy(chunk_rows=64))
    Capture(config).setup()
    execute(pg.dsn, "UPDATE kinds SET e = '{\"changed\": true}' WHERE a <= 3",
            "INSERT INTO parted VALUES (1000, 'eu', 1)")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        heads = {s.name: s.head for s in store.streams()}
        # (pgoutput also sends a partition's own Relation message: its stream stays empty)
        assert {n for n, h in heads.items() if h} == {"public.kinds", "public.parted"}
        assert "public.empty_one" in heads
        kinds = store.read_events("public.kinds", 1, 10_000)
        assert [e.operation for e in kinds[:500]] == ["read"] * 500
        assert [e.operation for e in kinds[500:]] == ["update"] * 3
        by_key = {(e.key or {})["b"] + str((e.key or {})["a"]): e for e in kinds[:500]}
        # values read by the snapshot equal the values the stream delivers for the same rows
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("UPDATE kinds SET a = a WHERE a = 10")
        capture_now(config)
        streamed = store.read_events("public.kinds", 504, 10)[0]
        assert streamed.after == by_key["k310"].after
        assert store.stream_schema("public.kinds").version == 1
        parted = replayed_rows(store, "public.parted")  # one stream through the root
        assert len(parted) == 301 and parted[1000]["region"] == "eu"
        assert store.head("public.empty_one") == 0
        table = store.read("public.kinds", 1, 10)
        assert table.column("_op").to_pylist() == ["read"] * 10


def test_without_initial_snapshot_only_changes_are_captured(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 100)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("items",), slot="nosnap",
                           snapshot=SnapshotPolicy(initial=False))
    Capture(config).setup()
    execute(pg.dsn, "UPDATE items SET v = 5 WHERE id = 1")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert store.read("public.items").column("_op").to_pylist() == ["update"]


def test_snapshots_into_a_store_in_another_database(pg: TestDatabase,
                                                    store_db: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 5_000)
    config = CaptureConfig(source_dsn=pg.dsn, store_dsn=store_db.dsn, tables=("items",),
                           slot="apart", stream_prefix="src.",
                           snapshot=SnapshotPolicy(chunk_rows=700, incremental_chunk_rows=900))
    Capture(config).setup()
    execute(pg.dsn, "DELETE FROM items WHERE id <= 100", "UPDATE items SET v = 3 WHERE id = 200")
    from lakefold.capture import resnapshot

    stats = resnapshot(config, ["items"])
    assert stats.rows == 4_900
    capture_now(config)
    with ChangelogStore(store_db.dsn) as store:
        ops = store.read("src.public.items", 1, 100_000).column("_op").to_pylist()
        assert ops == ["read"] * 5_000 + ["delete"] * 100 + ["update"] + ["read"] * 4_900
        assert replayed_rows(store, "src.public.items") == source_rows(pg.dsn, "public.items")
    with psycopg.connect(pg.dsn) as conn:  # nothing of the store in the source database
        assert conn.execute("SELECT to_regclass('lakefold.changelog')").fetchone() == (None,)
