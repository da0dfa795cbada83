"""Key and replica-identity changes in separate transactions: a stretch without a primary key
becomes a keyless schema version whose records keep the stream's identity, and the capture goes
on when the key returns; a change of REPLICA IDENTITY is a new schema version."""

from __future__ import annotations

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)


def _versions(store: ChangelogStore, stream: str) -> list[tuple[tuple[str, ...], bool, str]]:
    latest = store.stream_schema(stream).version
    schemas = [store.stream_schema(stream, v) for v in range(1, latest + 1)]
    return [(s.key_columns, s.keyless, s.replica_identity) for s in schemas]


def _ops_by_version(dsn: str, stream: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [(int(r[0]), str(r[1])) for r in conn.execute(
            "SELECT c.schema_version, c.op FROM lakefold.changelog c JOIN "
            "lakefold.changelog_streams s USING (stream_id) WHERE s.name = %s "
            "ORDER BY c.position", (stream,)).fetchall()]


def _compacted_keys(store: ChangelogStore, stream: str) -> list[int]:
    store.compact(stream)
    return sorted(e.key["id"] for e in store.read_events(stream, 1, 10_000)
                  if e.key is not None and e.operation != "delete")


def test_primary_key_dropped_and_readded_in_separate_transactions(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="rekey")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 5) g",
            "UPDATE t SET v = 'b' WHERE id = 1", "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "INSERT INTO t VALUES (6, 'keyless')")
    capture_now(config)  # the capture meets the table while it has no key
    execute(pg.dsn, "ALTER TABLE t ADD PRIMARY KEY (id)",
            "UPDATE t SET v = 'keyed again' WHERE id IN (1, 6)", "DELETE FROM t WHERE id = 2")
    capture_now(config)

    with ChangelogStore(pg.dsn) as store:
        # keyed, keyless (its records keep the stream's key "id"), keyed again
        assert _versions(store, "public.t") == [
            (("id",), False, "d"), (("id",), True, "d"), (("id",), False, "d")]
        assert _ops_by_version(pg.dsn, "public.t") == [(1, "i")] * 5 + [
            (1, "u"), (2, "i"), (3, "u"), (3, "u"), (3, "d")]
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")
        # the keyless stretch's insert and the later update share one key: compaction keeps
        # exactly one record per live row
        assert _compacted_keys(store, "public.t") == [1, 3, 4, 5, 6]


def test_keyless_stretch_under_replica_identity_full_uses_whole_rows(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "ALTER TABLE t REPLICA IDENTITY FULL")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="rekeyfull")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    # Under FULL the server flags every column, so the key comes from the current catalog:
    # capture these while the key exists.
    capture_now(config)
    execute(pg.dsn, "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "ALTER TABLE t DROP COLUMN id",  # the key column is gone: whole-row identity
            "UPDATE t SET v = 'B' WHERE v = 'b'", "DELETE FROM t WHERE v = 'c'",
            "INSERT INTO t VALUES ('d')")
    capture_now(config)
    execute(pg.dsn, "ALTER TABLE t ADD COLUMN n serial PRIMARY KEY",
            "UPDATE t SET v = 'D' WHERE v = 'd'")
    capture_now(config)

    with ChangelogStore(pg.dsn) as store:
        assert _versions(store, "public.t") == [
            (("id",), False, "f"), (("v",), True, "f"), (("n",), False, "f")]
        events = store.read_events("public.t", 1, 100)
        last = events[-1].after
        assert last is not None and last["v"] == "D"
        # an update of a whole-row identity is a delete of the old row and an insert
        assert [(e.schema_version, e.operation.value, e.key) for e in events[3:]] == [
            (2, "delete", {"v": "b"}), (2, "insert", {"v": "B"}), (2, "delete", {"v": "c"}),
            (2, "insert", {"v": "d"}), (3, "update", {"n": last["n"]})]
        assert events[-1].before is not None and events[-1].before["v"] == "d"


def test_replica_identity_change_is_a_new_schema_version(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="ident")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t VALUES (1, 'a')", "ALTER TABLE t REPLICA IDENTITY FULL",
            "UPDATE t SET v = 'b'", "ALTER TABLE t REPLICA IDENTITY DEFAULT",
            "UPDATE t SET v = 'c'")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert [v[2] for v in _versions(store, "public.t")] == ["d", "f", "d"]
        events = store.read_events("public.t", 1, 10)
        assert [(e.schema_version, e.before) for e in events] == [
            (1, None), (2, {"id": 1, "v": "a"}), (3, None)]
