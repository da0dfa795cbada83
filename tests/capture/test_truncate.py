"""TRUNCATE, TRUNCATE ... CASCADE and multi-table TRUNCATE become a truncate record in every
affected stream; readers and compaction treat it as "every earlier key deleted"."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)


def _ops(store: ChangelogStore, stream: str) -> list[str]:
    return [str(op) for op in store.read(stream, 1, 100_000).column("_op").to_pylist()]


def test_truncate_cascade_and_multi_table(pg: TestDatabase) -> None:
    execute(pg.dsn,
            "CREATE TABLE parent (id int PRIMARY KEY, name text)",
            "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent, v int)",
            "CREATE TABLE other (id int PRIMARY KEY, v int)",
            "CREATE TABLE lonely (id int PRIMARY KEY)",
            "INSERT INTO parent SELECT g, 'p' || g FROM generate_series(1, 50) g",
            "INSERT INTO child SELECT g, g % 50 + 1, g FROM generate_series(1, 200) g",
            "INSERT INTO other SELECT g, g FROM generate_series(1, 30) g",
            "INSERT INTO lonely SELECT g FROM generate_series(1, 5) g")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="trunc")
    Capture(config).setup()  # the existing rows are read by the initial snapshot
    execute(pg.dsn,
            "UPDATE child SET v = -1 WHERE id <= 10",
            "TRUNCATE parent CASCADE",  # child is truncated too
            "INSERT INTO parent VALUES (1, 'again')",
            "INSERT INTO child VALUES (1, 1, 1)",
            "TRUNCATE other, lonely",  # one statement, two tables
            "INSERT INTO other VALUES (7, 7)")
    execute(pg.dsn, "BEGIN", "INSERT INTO lonely VALUES (100)", "TRUNCATE lonely",
            "INSERT INTO lonely VALUES (101)", "COMMIT")
    capture_now(config)

    with ChangelogStore(pg.dsn) as store:
        assert _ops(store, "public.parent") == ["read"] * 50 + ["truncate", "insert"]
        assert _ops(store, "public.child") == ["read"] * 200 + ["update"] * 10 + [
            "truncate", "insert"]
        assert _ops(store, "public.other") == ["read"] * 30 + ["truncate", "insert"]
        assert _ops(store, "public.lonely") == ["read"] * 5 + [
            "truncate", "insert", "truncate", "insert"]
        parent_t = store.read_events("public.parent", 51, 1)[0]
        child_t = store.read_events("public.child", 211, 1)[0]
        # CASCADE: one source transaction, one truncate record per affected stream
        assert parent_t.operation == child_t.operation == "truncate"
        assert parent_t.commit_lsn == child_t.commit_lsn
        assert parent_t.key is None and parent_t.after is None
        other_t = store.read_events("public.other", 31, 1)[0]
        lonely_t = store.read_events("public.lonely", 6, 1)[0]
        assert other_t.commit_lsn == lonely_t.commit_lsn != parent_t.commit_lsn
        arrow = store.read("public.parent", 51, 1)
        assert arrow.column("_op").to_pylist() == ["truncate"]
        assert arrow.column("id").to_pylist() == [None]
        for table in ("parent", "child", "other", "lonely"):
            assert replayed_rows(store, f"public.{table}") == source_rows(pg.dsn,
                                                                          f"public.{table}")

        # compaction: a truncate removes every earlier record of its stream
        store.compact()
        assert _ops(store, "public.child") == ["truncate", "insert"]
        assert _ops(store, "public.lonely") == ["truncate", "insert"]
        assert replayed_rows(store, "public.child") == source_rows(pg.dsn, "public.child")
        store.compact(tombstone_retention=timedelta(0))  # expired truncates go as well
        assert _ops(store, "public.child") == ["insert"]
        assert replayed_rows(store, "public.child") == source_rows(pg.dsn, "public.child")
