"""Key and replica-identity changes in separate transactions. A table that loses its key
leaves the publication (PostgreSQL would refuse its UPDATE and DELETE otherwise) and, when the
key returns, rejoins: a truncate record, then a fresh snapshot, so its stream equals the table
again. Without the publication guard (a capture role that is not a superuser) a change can
still arrive while the table has no key: it becomes a keyless schema version whose records
keep the stream's identity. A change of REPLICA IDENTITY is a new schema version."""

from __future__ import annotations

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore, slot_health
from tests.capture.conftest import (
    capture_now,
    capture_settled,
    execute,
    replayed_rows,
    source_rows,
)
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
            "INSERT INTO t VALUES (6, 'keyless')", "UPDATE t SET v = 'c' WHERE id = 5")
    capture_settled(config)  # t left the publication with its key
    execute(pg.dsn, "ALTER TABLE t ADD PRIMARY KEY (id)",
            "UPDATE t SET v = 'keyed again' WHERE id IN (1, 6)", "DELETE FROM t WHERE id = 2")
    capture_settled(config)  # t rejoined: truncate, then every row read again

    with ChangelogStore(pg.dsn) as store:
        assert _versions(store, "public.t") == [(("id",), False, "d")]
        assert _ops_by_version(pg.dsn, "public.t") == [(1, "i")] * 5 + [
            (1, "u"), (1, "t"), (1, "u"), (1, "u"), (1, "d")] + [(1, "r")] * 5
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")
        assert _compacted_keys(store, "public.t") == [1, 3, 4, 5, 6]


def test_keyless_stretch_without_the_guard(pg: TestDatabase, replication_role: str) -> None:
    config = CaptureConfig(source_dsn=replication_role, tables=("t",), slot="rekeyplain")
    Capture(config).setup()  # not a superuser: no publication guard
    execute(replication_role, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 5) g",
            "UPDATE t SET v = 'b' WHERE id = 1", "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "INSERT INTO t VALUES (6, 'keyless')")
    capture_settled(config)  # meets the insert without a key, then takes t out
    execute(replication_role, "ALTER TABLE t ADD PRIMARY KEY (id)",
            "UPDATE t SET v = 'keyed again' WHERE id IN (1, 6)", "DELETE FROM t WHERE id = 2")
    capture_settled(config)  # puts t back: truncate, then every row read again

    with ChangelogStore(pg.dsn) as store:
        # keyed, keyless (its records keep the stream's key "id"), keyed again
        assert _versions(store, "public.t") == [
            (("id",), False, "d"), (("id",), True, "d"), (("id",), False, "d")]
        assert _ops_by_version(pg.dsn, "public.t") == [(1, "i")] * 5 + [
            (1, "u"), (2, "i"), (2, "t")] + [(3, "r")] * 5
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")
        # the keyless stretch's insert and the later read share one key: compaction keeps
        # exactly one record per live row
        assert _compacted_keys(store, "public.t") == [1, 3, 4, 5, 6]


def test_table_without_key_under_replica_identity_full_waits_for_a_key(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)",
            "ALTER TABLE t REPLICA IDENTITY FULL")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="rekeyfull")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    capture_settled(config)
    # Without a key, FULL keeps the table's UPDATE and DELETE working, but lakefold keys
    # records and copies snapshots by a key: the table waits outside the publication.
    execute(pg.dsn, "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "ALTER TABLE t DROP COLUMN id", "UPDATE t SET v = 'B' WHERE v = 'b'",
            "DELETE FROM t WHERE v = 'c'", "INSERT INTO t VALUES ('d')")
    capture_settled(config)
    assert [t["table"] for t in slot_health(config).tables_not_captured] == ["public.t"]
    execute(pg.dsn, "ALTER TABLE t ADD COLUMN n serial PRIMARY KEY",
            "UPDATE t SET v = 'D' WHERE v = 'd'")
    capture_settled(config)

    with ChangelogStore(pg.dsn) as store:
        assert _versions(store, "public.t") == [(("id",), False, "f"), (("n",), False, "f")]
        events = store.read_events("public.t", 1, 100)
        # joined (truncate), the update after the key in the stream, then the fresh read
        assert [e.operation.value for e in events] == ["insert"] * 3 + [
            "truncate", "update"] + ["read"] * 3
        assert {e.after["n"]: e.after["v"] for e in events[4:] if e.after} == {
            n: r["v"] for n, r in source_rows(pg.dsn, "public.t", key="n").items()}


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
