"""Unchanged TOASTed values (1 MB text, update not touching it) are filled from the latest
record of the key: after a snapshot read, an insert, a chain of updates, a key change, inside a
streamed large transaction, across a schema change, and from the old image under REPLICA
IDENTITY FULL. No record ever carries a placeholder or a lost value."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig, ChangelogStore, SnapshotPolicy
from tests.capture.conftest import (
    capture_now,
    execute,
    replayed_rows,
    source_rows,
    stored_records,
)
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)

BODY = ("SELECT string_agg(md5(%s::text || g::text), '') FROM generate_series(1, 32768) g")


def _body(conn: psycopg.Connection, seed: str) -> str:
    row = conn.execute(BODY, (seed,)).fetchone()
    assert row is not None and len(row[0]) == 1 << 20
    return str(row[0])


def _updates_carry_bodies(store: ChangelogStore, stream: str) -> int:
    checked = 0
    for event in store.read_events(stream, 1, 10_000):
        if event.operation in ("update", "insert", "read"):
            assert event.after is not None
            assert event.after["body"] is not None, (event.position, event.operation)
            assert len(event.after["body"]) == 1 << 20
            checked += 1
    return checked


def test_unchanged_toast_is_filled_from_the_latest_record_of_the_key(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE docs (id int PRIMARY KEY, status text, body text)")
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for i in (1, 2):
            conn.execute("INSERT INTO docs VALUES (%s, 'new', %s)", (i, _body(conn, f"s{i}")))
        # stored out of line: an update leaves it as an unchanged-TOAST marker in the WAL
        stored = conn.execute("SELECT pg_relation_size(reltoastrelid) FROM pg_class "
                              "WHERE relname = 'docs'").fetchone()
        assert stored is not None and stored[0] >= 2 << 20
    config = CaptureConfig(source_dsn=pg.dsn, tables=("docs",), slot="toast",
                           batch_rows=2, snapshot=SnapshotPolicy(chunk_rows=1))
    Capture(config).setup()  # rows 1 and 2 are read by the initial snapshot
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("UPDATE docs SET status = 'seen' WHERE id = 1")  # fill from the read
        conn.execute("INSERT INTO docs VALUES (3, 'new', %s)", (_body(conn, "s3"),))
        with conn.transaction():  # a chain of updates in one transaction
            for status in ("a", "b", "c"):
                conn.execute("UPDATE docs SET status = %s WHERE id = 3", (status,))
        conn.execute("UPDATE docs SET status = 'd' WHERE id = 3")
        conn.execute("UPDATE docs SET id = 30 WHERE id = 3")  # key change: fill from key 3
        conn.execute("UPDATE docs SET status = 'moved' WHERE id = 30")
        conn.execute("UPDATE docs SET body = %s WHERE id = 2", (_body(conn, "new2"),))
        conn.execute("UPDATE docs SET status = 'after new body' WHERE id = 2")
        conn.execute("ALTER TABLE docs ADD COLUMN extra int DEFAULT 5")
        conn.execute("UPDATE docs SET status = 'after ddl' WHERE id = 1")  # fill by name
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert _updates_carry_bodies(store, "public.docs") >= 12
        columns = ("id", "status", "body")  # rows unchanged since the ADD COLUMN lack 'extra'
        replayed = {k: {c: r[c] for c in columns}
                    for k, r in replayed_rows(store, "public.docs").items()}
        assert replayed == {k: {c: r[c] for c in columns}
                            for k, r in source_rows(pg.dsn, "public.docs").items()}
        ops = [str(e.operation) for e in store.read_events("public.docs", 1, 100)]
        assert ops.count("update") >= 9 and ops[:2] == ["read", "read"]


def test_unchanged_toast_inside_a_streamed_transaction(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE docs (id int PRIMARY KEY, status text, body text)",
            sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
                sql.Identifier(pg.name)))
    config = CaptureConfig(source_dsn=pg.dsn, tables=("docs",), slot="toaststream", streaming=True,
                           batch_rows=3)
    Capture(config).setup()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO docs VALUES (1, 'new', %s)", (_body(conn, "one"),))
        with conn.transaction():  # > logical_decoding_work_mem: streamed while in progress
            for i in range(2, 6):
                conn.execute("INSERT INTO docs VALUES (%s, 'new', %s)", (i, _body(conn, str(i))))
            for i in range(1, 6):
                conn.execute("UPDATE docs SET status = 'x' WHERE id = %s", (i,))
            with conn.transaction():  # an aborted subtransaction shifts the ordinals
                conn.execute("UPDATE docs SET status = 'gone' WHERE id = 2")
                conn.execute("SAVEPOINT s")
            try:
                with conn.transaction():
                    conn.execute("UPDATE docs SET status = 'rolled back' WHERE id = 3")
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
            conn.execute("UPDATE docs SET status = 'y' WHERE id = 4")
    capture_now(config)
    with psycopg.connect(pg.dsn) as conn:
        staged = conn.execute("SELECT count(*) FROM lakefold.changelog WHERE xid <> 0 AND "
                              "commit_lsn = (SELECT max(commit_lsn) FROM lakefold.changelog)"
                              ).fetchone()
        streamed = conn.execute("SELECT stream_txns FROM pg_stat_replication_slots "
                                "WHERE slot_name = 'toaststream'").fetchone()
    assert staged is not None and staged[0] == 11
    assert streamed is not None and streamed[0] >= 1  # it really went through the staging
    with ChangelogStore(pg.dsn) as store:
        assert _updates_carry_bodies(store, "public.docs") == 12
        assert replayed_rows(store, "public.docs") == source_rows(pg.dsn, "public.docs")


def test_replica_identity_full_carries_before_images_and_fills_from_them(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE docs (id int PRIMARY KEY, status text, body text)",
            "ALTER TABLE docs REPLICA IDENTITY FULL")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("docs",), slot="toastfull")
    Capture(config).setup()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        body = _body(conn, "full")
        conn.execute("INSERT INTO docs VALUES (1, 'new', %s)", (body,))
        conn.execute("UPDATE docs SET status = 'seen' WHERE id = 1")
        conn.execute("DELETE FROM docs WHERE id = 1")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        insert, update, delete = store.read_events("public.docs", 1, 10)
        assert update.before == {"id": 1, "status": "new", "body": body}
        assert update.after == {"id": 1, "status": "seen", "body": body}
        assert delete.before == {"id": 1, "status": "seen", "body": body}
        assert delete.key == {"id": 1} and insert.after == update.before


class _Interrupt(Exception):
    pass


class _StopAfterFirstChunk:
    """A snapshot listener that interrupts the initial snapshot after its first chunk."""

    def table_started(self, table: str, estimated_rows: int, done_rows: int) -> None:
        del table, estimated_rows, done_rows

    def rows_copied(self, table: str, rows: int) -> None:
        raise _Interrupt(f"{table}: interrupted after {rows} rows")

    def table_done(self, table: str, rows: int) -> None:
        del table, rows


def _capture_until_reread(config: CaptureConfig, dsn: str) -> None:
    """Run the capture until no re-read of a row is pending and its record is stored."""
    for _ in range(20):
        capture_now(config)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM lakefold.capture_rereads").fetchone()
        if row is not None and row[0] == 0:
            capture_now(config)
            return
    raise AssertionError("the capture did not re-read the rows it queued")


def test_unchanged_toast_of_a_row_not_yet_stored_after_a_resumed_snapshot(
        pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE docs (id int PRIMARY KEY, status text, body text)")
    bodies = {}
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for i in range(1, 7):
            bodies[i] = _body(conn, f"r{i}")
            conn.execute("INSERT INTO docs VALUES (%s, 'new', %s)", (i, bodies[i]))
    config = CaptureConfig(source_dsn=pg.dsn, tables=("docs",), slot="toastresume",
                           snapshot=SnapshotPolicy(chunk_rows=2, workers=1))
    with pytest.raises(_Interrupt):  # rows 1 and 2 are stored, 3 to 6 are not
        Capture(config, listener=_StopAfterFirstChunk()).setup()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        # committed after the slot's consistent point, before the resumed chunks are read
        conn.execute("UPDATE docs SET status = 'seen' WHERE id = 5")
        conn.execute("UPDATE docs SET status = 'moved', id = 0 WHERE id = 6")  # below chunk 1
        conn.execute("UPDATE docs SET status = 'seen' WHERE id = 1")  # stored: filled
    _capture_until_reread(config, pg.dsn)

    with ChangelogStore(pg.dsn) as store:
        events = store.read_events("public.docs", 1, 100)
        for event in events:
            if event.after is not None:
                key = 6 if event.after["id"] == 0 else event.after["id"]
                assert event.after["body"] == bodies[key], (event.position, event.operation)
        assert replayed_rows(store, "public.docs") == source_rows(pg.dsn, "public.docs")
    with psycopg.connect(pg.dsn) as conn:  # the records left out are not counted
        counted = conn.execute("SELECT records FROM lakefold.capture_slots").fetchone()
    assert counted == (stored_records(pg.dsn),)
