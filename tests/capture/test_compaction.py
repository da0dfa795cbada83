"""Compaction: the latest record per key, tombstones with retention, truncates; online,
concurrently with the capture and with readers, which never see half a source transaction."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    CompactionPolicy,
    UnknownStreamError,
)
from tests.capture.conftest import capture_now, execute, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)


def live_rows(store: ChangelogStore, stream: str) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """(rows of inserts/updates by id, ids of tombstones) read from position 0."""
    table = store.read(stream, 0, 1_000_000)
    rows: dict[int, dict[str, Any]] = {}
    tombstones: set[int] = set()
    for record in table.to_pylist():
        if record["_op"] == "delete":
            tombstones.add(record["id"])
        else:
            rows[record["id"]] = {k: v for k, v in record.items() if not k.startswith("_")}
    return rows, tombstones


def test_compaction_keeps_exactly_the_current_rows_and_recent_tombstones(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="compact")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t SELECT g, 0 FROM generate_series(1, 300) g",
            "UPDATE t SET v = 1 WHERE id % 2 = 0", "UPDATE t SET v = 2 WHERE id % 3 = 0",
            "DELETE FROM t WHERE id > 250", "INSERT INTO t VALUES (260, 9)",
            "UPDATE t SET id = 1000 WHERE id = 7")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        before = store.head("public.t")
        removed = store.compact("public.t", chunk_positions=97)
        rows, tombstones = live_rows(store, "public.t")
        expected = source_rows(pg.dsn, "public.t")
        assert rows == expected
        assert tombstones == set(range(251, 301)) - {260} | {7}
        assert removed["public.t"] == before - len(rows) - len(tombstones)
        assert store.head("public.t") == before  # positions are never reused

        execute(pg.dsn, "UPDATE t SET v = 5 WHERE id < 20", "DELETE FROM t WHERE id = 1",
                "INSERT INTO t VALUES (251, 1)")
        capture_now(config)
        store.compact("public.t")  # incremental: only the new records are examined
        rows, tombstones = live_rows(store, "public.t")
        assert rows == source_rows(pg.dsn, "public.t")
        assert 1 in tombstones and 251 not in tombstones

        store.compact("public.t", tombstone_retention=timedelta(0))
        rows, tombstones = live_rows(store, "public.t")
        assert rows == source_rows(pg.dsn, "public.t") and tombstones == set()
        with psycopg.connect(pg.dsn) as conn:
            mapped = conn.execute("SELECT count(*) FROM lakefold.changelog_keys").fetchone()
        assert mapped == (len(rows),)


def test_truncate_supersedes_everything_before_it(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="trunc")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t SELECT g, 0 FROM generate_series(1, 50) g", "TRUNCATE t",
            "INSERT INTO t VALUES (1, 1), (2, 2)")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.compact("public.t")
        ops = store.read("public.t").column("_op").to_pylist()
        assert ops == ["truncate", "insert", "insert"]
        store.compact("public.t", tombstone_retention=timedelta(0))
        assert store.read("public.t").column("id").to_pylist() == [1, 2]


GROUPS = 12
GROUP_SIZE = 40


def _group_workload(dsn: str, transactions: int, seed: int) -> None:
    """Every transaction rewrites one whole group of keys (same value on all its rows), or
    deletes and re-inserts it: a consistent view has one value per group."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in range(1, transactions + 1):
            group = rng.randrange(GROUPS)
            with conn.transaction():
                if rng.random() < 0.2:
                    conn.execute("DELETE FROM g WHERE grp = %s", (group,))
                    conn.execute("INSERT INTO g SELECT %s * 1000 + i, %s, %s "
                                 "FROM generate_series(1, %s) i", (group, group, n, GROUP_SIZE))
                else:
                    conn.execute("UPDATE g SET val = %s WHERE grp = %s", (n, group))
            time.sleep(rng.random() * 0.01)


def _check_consistent(records: list[dict[str, Any]]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["_op"] == "delete":
            state.pop(record["id"], None)
        else:
            state[record["id"]] = record
    groups: dict[int, set[int]] = {}
    sizes: dict[int, int] = {}
    for row in state.values():
        groups.setdefault(row["grp"], set()).add(row["val"])
        sizes[row["grp"]] = sizes.get(row["grp"], 0) + 1
    for group, values in groups.items():
        assert len(values) == 1, f"group {group} shows half a transaction: {values}"
        assert sizes[group] == GROUP_SIZE, f"group {group} has {sizes[group]} rows"


def test_compaction_concurrent_with_capture_and_readers(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE g (id int PRIMARY KEY, grp int NOT NULL, val int NOT NULL)")
    execute(pg.dsn, "INSERT INTO g SELECT grp * 1000 + i, grp, 0 FROM generate_series(0, 11) grp, "
                    "generate_series(1, 40) i")
    # Small batches: transactions of 40-80 records are split over several store batches.
    config = CaptureConfig(
        source_dsn=pg.dsn, tables=("g",), slot="busy", batch_rows=16,
        compaction=CompactionPolicy(interval=timedelta(milliseconds=150),
                                    tombstone_retention=timedelta(0), chunk_positions=200))
    capture = Capture(config)
    capture.setup()
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def read_loop() -> None:
        try:
            with ChangelogStore(pg.dsn) as store:
                while not stop.is_set():
                    try:
                        table = store.read("public.g", 0, 1_000_000)
                    except UnknownStreamError:  # nothing captured yet
                        time.sleep(0.05)
                        continue
                    _check_consistent(table.to_pylist())
                    reads[0] += 1
        except BaseException as e:  # surfaced below
            errors.append(e)

    capturer = threading.Thread(target=lambda: capture.run(stop=stop))
    readers = [threading.Thread(target=read_loop) for _ in range(2)]
    capturer.start()
    for reader in readers:
        reader.start()
    try:
        _group_workload(pg.dsn, transactions=150, seed=7)
        time.sleep(0.5)
    finally:
        stop.set()
        capturer.join(60)
        for reader in readers:
            reader.join(60)
    assert not errors, errors
    assert reads[0] > 5
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.compact("public.g", tombstone_retention=timedelta(0))
        rows, tombstones = live_rows(store, "public.g")
        assert rows == source_rows(pg.dsn, "public.g") and not tombstones
        with psycopg.connect(pg.dsn) as conn:
            total = conn.execute("SELECT count(*) FROM lakefold.changelog").fetchone()
        assert total == (GROUPS * GROUP_SIZE,)


@pytest.mark.timeout(120)
def test_compaction_stays_linear_when_the_statistics_are_stale(pg: TestDatabase) -> None:
    """The store's statistics were taken when its positions were small (autovacuum analyses a
    large table rarely), so the planner takes each new chunk for one row. Compaction must not
    build a plan that is quadratic then: it used to take minutes for 200,000 records."""
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="stale")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t SELECT g, 0 FROM generate_series(1, 3000) g",
            "UPDATE t SET v = 1 WHERE id <= 1000")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.compact("public.t")
    execute(pg.dsn, "ANALYZE lakefold.changelog", "ANALYZE lakefold.changelog_keys",
            "ALTER TABLE lakefold.changelog SET (autovacuum_enabled = false)",
            "ALTER TABLE lakefold.changelog_keys SET (autovacuum_enabled = false)",
            "INSERT INTO t SELECT g, 0 FROM generate_series(3001, 103000) g",
            "UPDATE t SET v = 2",  # every key again: older records in later chunks
            "DELETE FROM t WHERE id % 10 = 0")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        before = store.head("public.t")
        removed = store.compact("public.t", tombstone_retention=timedelta(0))
        rows, tombstones = live_rows(store, "public.t")
        assert rows == source_rows(pg.dsn, "public.t")
        assert tombstones == set()
        assert removed["public.t"] == before - 1000 - len(rows)  # the first run's removals
    with psycopg.connect(pg.dsn) as conn:
        mapped = conn.execute("SELECT count(*) FROM lakefold.changelog_keys").fetchone()
    assert mapped == (len(rows),)
