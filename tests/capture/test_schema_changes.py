"""Schema changes in stream order: 20 DDL statements (add, drop and rename column, type
changes, primary-key changes, replica identity) interleaved with 100k row changes while the
capture runs. No batch fails, every record carries its schema version, every version can be
read back, and the final stream schema equals the source table."""

from __future__ import annotations

import threading

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(240)

DDL = [
    "ALTER TABLE t ADD COLUMN c1 int",
    "ALTER TABLE t ADD COLUMN c2 text DEFAULT 'x'",
    "ALTER TABLE t RENAME COLUMN v TO value",
    "ALTER TABLE t ALTER COLUMN c1 TYPE bigint",
    "ALTER TABLE t DROP COLUMN c2",
    "ALTER TABLE t ADD COLUMN c3 numeric(10, 2)",
    "ALTER TABLE t ALTER COLUMN c3 TYPE numeric(12, 4)",
    "ALTER TABLE t RENAME COLUMN c1 TO big",
    "ALTER TABLE t ALTER COLUMN value TYPE text USING value::text",
    "ALTER TABLE t ADD COLUMN c4 jsonb",
    "ALTER TABLE t ADD COLUMN k2 int NOT NULL DEFAULT 0",
    "BEGIN; ALTER TABLE t DROP CONSTRAINT t_pkey; ALTER TABLE t ADD PRIMARY KEY (id, k2); "
    "COMMIT",
    "ALTER TABLE t REPLICA IDENTITY FULL",
    "ALTER TABLE t REPLICA IDENTITY DEFAULT",
    "ALTER TABLE t ADD COLUMN c5 timestamptz DEFAULT '2024-01-01 00:00:00+00'",
    "ALTER TABLE t DROP COLUMN c4",
    "ALTER TABLE t ADD COLUMN c6 int[]",
    "ALTER TABLE t ALTER COLUMN big TYPE int USING big::int",
    "ALTER TABLE t DROP COLUMN c6",
    "BEGIN; ALTER TABLE t DROP CONSTRAINT t_pkey; ALTER TABLE t ADD PRIMARY KEY (id); COMMIT",
]
SEGMENT = 5_000  # row changes between two DDL statements: 20 x 5,000 = 100k


def _dml(conn: psycopg.Connection, segment: int) -> int:
    base = 1_000_000 + segment * 10_000
    changes = 0
    cur = conn.execute("INSERT INTO t (id) SELECT g FROM generate_series(%s, %s) g",
                       (base, base + 1_999))
    changes += cur.rowcount
    cur = conn.execute("UPDATE t SET id = id WHERE id IN (SELECT id FROM t ORDER BY "
                       "random() LIMIT 2000)")
    changes += cur.rowcount
    cur = conn.execute("DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY random() "
                       "LIMIT 1000)")
    return changes + cur.rowcount


def _source_columns(dsn: str) -> list[tuple[str, str, bool]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, NULL), "
            "a.attnum = ANY(coalesce(i.indkey::int2[], '{}')) FROM pg_attribute a "
            "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
            "WHERE a.attrelid = 't'::regclass AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum").fetchall()
    return [(r[0], r[1], bool(r[2])) for r in rows]


def test_ddl_interleaved_with_100k_changes(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int DEFAULT 1)",
            "INSERT INTO t (id) SELECT g FROM generate_series(1, 5000) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="ddl", batch_rows=3_000)
    Capture(config).setup()
    stop = threading.Event()
    failures: list[BaseException] = []
    stats = []

    def capture() -> None:
        try:
            stats.append(Capture(config).run(stop=stop))
        except BaseException as e:  # reported below
            failures.append(e)

    runner = threading.Thread(target=capture, daemon=True)
    runner.start()
    changes = 0
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for segment, ddl in enumerate(DDL):
            changes += _dml(conn, segment)
            for statement in ddl.split("; "):
                conn.execute(statement)
        conn.execute("UPDATE t SET id = id")  # every row's last record has the last schema
    stop.set()
    runner.join(60)
    assert not failures, failures
    assert changes >= 100_000
    assert stats and stats[0].reconnects == 0  # no batch failed
    capture_now(config)

    with ChangelogStore(pg.dsn) as store, psycopg.connect(pg.dsn) as conn:
        latest = store.stream_schema("public.t")
        assert [(c.name, c.key) for c in latest.columns] == [
            (name, key) for name, _, key in _source_columns(pg.dsn)]
        assert [c.type_name for c in latest.columns] == [
            "int4", "text", "int4", "numeric", "int4", "timestamptz"]
        assert latest.replica_identity == "d" and latest.key_columns == ("id",)
        assert latest.version >= 16
        versions = [store.stream_schema("public.t", v) for v in range(1, latest.version + 1)]
        assert ("id", "k2") in [v.key_columns for v in versions]  # the primary-key change
        # under REPLICA IDENTITY FULL the updates carried whole before-images
        full = conn.execute(
            "SELECT count(*) FROM lakefold.changelog WHERE op = 'u' AND before IS NOT NULL "
            "AND array_length(before, 1) > 3").fetchone()
        assert full is not None and full[0] >= 2_000
        # records carry non-decreasing versions in stream order, and every version is used
        used = [r[0] for r in conn.execute(
            "SELECT c.schema_version FROM lakefold.changelog c JOIN lakefold.changelog_streams "
            "s USING (stream_id) WHERE s.name = 'public.t' ORDER BY c.position").fetchall()]
        assert used == sorted(used)
        assert set(used) == set(range(1, latest.version + 1))
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")
