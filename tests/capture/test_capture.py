"""End-to-end capture into changelog streams on a real server."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig, CaptureError, ChangelogStore, resnapshot
from tests.capture.conftest import (
    capture_now,
    execute,
    replayed_rows,
    source_rows,
    stream_records,
    wal_insert_lsn,
)
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)


def test_changes_become_dense_keyed_records_per_table(pg: TestDatabase) -> None:
    execute(pg.dsn,
            "CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10, 2), note text)",
            "CREATE TABLE lines (order_id int, n int, sku text, PRIMARY KEY (order_id, n))")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="e2e")
    Capture(config).setup()
    execute(
        pg.dsn,
        "INSERT INTO orders SELECT g, g * 1.5, 'n' || g FROM generate_series(1, 50) g",
        "INSERT INTO lines SELECT g % 10, g, 'sku' || g FROM generate_series(1, 30) g",
        "UPDATE orders SET amount = amount + 1 WHERE id <= 10",
        "DELETE FROM orders WHERE id BETWEEN 11 AND 15",
        "UPDATE orders SET id = 1000 WHERE id = 20",  # key change: delete + insert
        "UPDATE lines SET sku = 'changed' WHERE n = 3",
        "INSERT INTO orders VALUES (15, 0, 'back')",
    )
    with psycopg.connect(pg.dsn) as conn:  # one transaction over both tables
        conn.execute("INSERT INTO orders VALUES (2000, 1, 'tx')")
        conn.execute("DELETE FROM lines WHERE order_id = 1")
    stats = capture_now(config)

    with ChangelogStore(pg.dsn) as store:
        assert [s.name for s in store.streams()] == ["public.lines", "public.orders"]
        for stream in ("public.orders", "public.lines"):
            records = stream_records(pg.dsn, stream)
            assert [r[0] for r in records] == list(range(1, len(records) + 1))
            assert store.head(stream) == len(records)
            if stream == "public.orders":
                assert replayed_rows(store, stream) == source_rows(pg.dsn, "public.orders")
        lines = replayed_rows_composite(store)
        assert lines == {(r["order_id"], r["n"]): r
                         for r in source_rows(pg.dsn, "public.lines", "n").values()}
        key_change = [e for e in store.read_events("public.orders", 1, 1000)
                      if ((e.key or {}).get("id") in (20, 1000) and e.operation != "insert")
                      or (e.key or {}).get("id") == 1000]
        assert [(e.operation, e.key) for e in key_change] == [
            ("delete", {"id": 20}), ("insert", {"id": 1000})]
        assert key_change[0].commit_lsn == key_change[1].commit_lsn
        assert key_change[1].ordinal == key_change[0].ordinal + 1
        assert store.stream_schema("public.lines").key_columns == ("order_id", "n")
    both = stream_records(pg.dsn, "public.orders") + stream_records(pg.dsn, "public.lines")
    assert stats.records == len(both)
    by_commit = Counter(r[1] for r in both)
    ordinals: dict[int, list[int]] = {}
    for _, lsn, ordinal, _ in both:
        ordinals.setdefault(lsn, []).append(ordinal)
    for lsn, found in ordinals.items():  # ordinals are dense across the transaction's streams
        assert sorted(found) == list(range(1, by_commit[lsn] + 1))


def replayed_rows_composite(store: ChangelogStore) -> dict[tuple[Any, Any], dict[str, Any]]:
    rows: dict[tuple[Any, Any], dict[str, Any]] = {}
    for event in store.read_events("public.lines", 1, 10_000):
        key = (event.key or {}).get("order_id"), (event.key or {}).get("n")
        if event.operation == "delete":
            rows.pop(key, None)
        else:
            assert event.after is not None
            rows[key] = event.after
    return rows


def test_replica_identity_full_before_images_and_truncate(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE f (id int PRIMARY KEY, v text, w int)",
            "ALTER TABLE f REPLICA IDENTITY FULL")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("f",), slot="full")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO f VALUES (1, 'a', 1), (2, 'b', 2)",
            "UPDATE f SET v = 'A' WHERE id = 1", "DELETE FROM f WHERE id = 2", "TRUNCATE f",
            "INSERT INTO f VALUES (3, 'c', 3)")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        events = store.read_events("public.f")
        assert [e.operation for e in events] == ["insert", "insert", "update", "delete",
                                                 "truncate", "insert"]
        assert events[2].before == {"id": 1, "v": "a", "w": 1}
        assert events[2].after == {"id": 1, "v": "A", "w": 1}
        assert events[3].before == {"id": 2, "v": "b", "w": 2} and events[3].after is None
        assert events[4].key is None and events[4].after is None
        table = store.read("public.f")
        assert table.column("_op").to_pylist() == [e.operation.value for e in events]
        assert table.column("v").to_pylist() == ["a", "b", "A", "b", None, "c"]
        assert replayed_rows(store, "public.f") == source_rows(pg.dsn, "public.f")


def _interleaved_workload(dsn: str) -> None:
    """A big transaction (streamed with a small logical_decoding_work_mem) with a rolled-back
    savepoint, while small transactions commit in between."""
    big = psycopg.connect(dsn)
    try:
        big.execute("INSERT INTO t SELECT g, repeat('x', 300) FROM generate_series(1, 2000) g")
        execute(dsn, "INSERT INTO u VALUES (1, 'small before')")
        big.execute("SAVEPOINT s")
        big.execute("INSERT INTO t SELECT g, 'gone' FROM generate_series(5001, 6000) g")
        big.execute("ROLLBACK TO SAVEPOINT s")
        big.execute("UPDATE t SET v = 'updated' WHERE id % 7 = 0")
        big.execute("INSERT INTO u VALUES (2, 'in big')")
        execute(dsn, "INSERT INTO u VALUES (3, 'small during')", "DELETE FROM u WHERE id = 1")
        big.commit()
        execute(dsn, "UPDATE u SET v = 'small after' WHERE id = 3")
    finally:
        big.close()


def test_streamed_and_unstreamed_capture_store_identical_records(
        pg: TestDatabase, store_db: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "CREATE TABLE u (id int PRIMARY KEY, v text)",
            sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
                sql.Identifier(pg.name)))
    streamed = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="on",
                             publication="p_on", streaming=True, batch_rows=300)
    spilled = CaptureConfig(source_dsn=pg.dsn, store_dsn=store_db.dsn, schema="public",
                            slot="off", publication="p_off", streaming=False, batch_rows=300)
    Capture(streamed).setup()
    Capture(spilled).setup()
    _interleaved_workload(pg.dsn)
    capture_now(streamed)
    capture_now(spilled)
    query = ("SELECT s.name, c.position, c.commit_lsn, c.ordinal, c.xid, c.op, c.key, c.after, "
             "c.before FROM lakefold.changelog c JOIN lakefold.changelog_streams s "
             "USING (stream_id) ORDER BY s.name, c.position")
    with psycopg.connect(pg.dsn) as a, psycopg.connect(store_db.dsn) as b:
        on = a.execute(query).fetchall()
        off = b.execute(query).fetchall()
        staged = a.execute("SELECT count(*) FROM lakefold.capture_staging_on").fetchone()
    assert len(on) == 2000 + 2000 // 7 + 5
    assert on == off
    assert staged == (0,)
    with ChangelogStore(pg.dsn) as store:
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")
        assert replayed_rows(store, "public.u") == source_rows(pg.dsn, "public.u")


def test_restarting_continues_without_duplicates(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="again",
                           batch_rows=7)
    Capture(config).setup()
    for round_ in range(3):
        execute(pg.dsn, f"INSERT INTO t SELECT g, {round_} FROM generate_series("
                        f"{round_ * 100 + 1}, {round_ * 100 + 100}) g ON CONFLICT DO NOTHING",
                f"UPDATE t SET v = v + 1 WHERE id % 5 = {round_}")
        capture_now(config)
        capture_now(config)  # nothing new: nothing written twice
    records = stream_records(pg.dsn, "public.t")
    assert len({(r[1], r[2]) for r in records}) == len(records)
    assert [r[0] for r in records] == list(range(1, len(records) + 1))
    with ChangelogStore(pg.dsn) as store:
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")


def test_schema_changes_become_versions_read_by_name(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, a text, b int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="ddl")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t VALUES (1, 'x', 1)",
            "ALTER TABLE t ADD COLUMN c timestamptz DEFAULT '2024-01-01Z'",
            "INSERT INTO t VALUES (2, 'y', 2)",
            "ALTER TABLE t DROP COLUMN a", "INSERT INTO t VALUES (3, 3)")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert store.stream_schema("public.t", 1).column_names == ("id", "a", "b")
        assert store.stream_schema("public.t", 2).column_names == ("id", "a", "b", "c")
        latest = store.stream_schema("public.t")
        assert (latest.version, latest.column_names) == (3, ("id", "b", "c"))
        table = store.read("public.t")
        assert table.column_names[-3:] == ["id", "b", "c"]
        assert table.column("_schema_version").to_pylist() == [1, 2, 3]
        assert table.column("b").to_pylist() == [1, 2, 3]
        assert [v is None for v in table.column("c").to_pylist()] == [True, False, False]
        events = store.read_events("public.t")
        assert events[0].after == {"id": 1, "a": "x", "b": 1}
        assert events[2].schema_version == 3


def test_logical_decoding_messages_are_kept_when_asked(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="msgs", keep_messages=True)
    Capture(config).setup()
    with psycopg.connect(pg.dsn) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("SELECT pg_logical_emit_message(true, 'app', 'in tx')")
    execute(pg.dsn, "SELECT pg_logical_emit_message(false, 'app', 'outside')")
    until = wal_insert_lsn(pg.dsn)
    Capture(config).run(until_lsn=until)
    Capture(config).run(until_lsn=until)  # again: no duplicates
    with psycopg.connect(pg.dsn) as conn:
        rows = conn.execute(
            "SELECT prefix, content, transactional, ordinal FROM lakefold.capture_messages "
            "WHERE prefix = 'app' ORDER BY lsn").fetchall()
    assert rows == [("app", b"in tx", True, 1), ("app", b"outside", False, 0)]


@pytest.mark.parametrize("scope", [{"schema": "public"}, {"tables": ("m",)}],
                         ids=["schema", "table"])
def test_partitioned_table_is_one_stream(pg: TestDatabase, scope: dict[str, Any]) -> None:
    execute(pg.dsn,
            "CREATE TABLE m (id int, region text, v int, PRIMARY KEY (id, region)) "
            "PARTITION BY LIST (region)",
            "CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu')",
            "CREATE TABLE m_us PARTITION OF m FOR VALUES IN ('us')",
            "INSERT INTO m VALUES (0, 'eu', 0)")  # copied by the initial snapshot
    config = CaptureConfig(source_dsn=pg.dsn, slot="parts", **scope)
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO m VALUES (1, 'eu', 1), (2, 'us', 2)",
            "UPDATE m SET v = 3 WHERE id = 2", "UPDATE m SET region = 'us' WHERE id = 1",
            "CREATE TABLE m_asia PARTITION OF m FOR VALUES IN ('asia')",
            "INSERT INTO m VALUES (3, 'asia', 3)")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        # one stream for the partitioned table; no (empty) stream for any partition
        assert [s.name for s in store.streams()] == ["public.m"]
        ops = store.read("public.m").column("_op").to_pylist()
        # a row that moves partition is a delete and an insert
        assert ops == ["read", "insert", "insert", "update", "delete", "insert", "insert"]
    with pytest.raises(CaptureError, match=r"partition of public\.m\b.*re-snapshot public\.m"):
        resnapshot(config, ["m_eu"])  # a partition's rows are in its root's stream
        rows = {(e.key or {})["id"]: e for e in store.read_events("public.m")}
        assert rows[1].after == {"id": 1, "region": "us", "v": 1}
