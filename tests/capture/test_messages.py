"""Every pgoutput message type from a real server (protocol v2 with streaming and messages),
cross-checked change by change against test_decoding output for the same WAL."""

from __future__ import annotations

import select
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lakefold.capture.decoding import _pgoutput as pgo
from lakefold.capture.decoding._replication_connection import ReplicationConnection, parse_keepalive
from tests.capture.conftest import execute, wal_insert_lsn
from tests.capture.test_values import SESSION, parse_test_decoding
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)


def workload(dsn: str) -> None:
    execute(
        dsn,
        "INSERT INTO t VALUES (1, 'one', 'ok'), (2, 'two', 'sad')",
        "UPDATE t SET v = 'uno' WHERE id = 1",
        "UPDATE t SET id = 102 WHERE id = 2",
        "DELETE FROM t WHERE id = 1",
        "INSERT INTO full_t VALUES (1, 'a'), (2, 'b')",
        "UPDATE full_t SET v = 'A' WHERE id = 1",
        "DELETE FROM full_t WHERE id = 2",
        "TRUNCATE t, full_t",
        "SELECT pg_logical_emit_message(false, 'side', 'not in a transaction')",
    )
    with psycopg.connect(dsn) as conn:  # a transactional message next to a change
        conn.execute("INSERT INTO t VALUES (3, 'three', 'happy')")
        conn.execute("SELECT pg_logical_emit_message(true, 'app', 'hello')")
    with psycopg.connect(dsn, autocommit=True) as conn:  # a transaction from an origin
        conn.execute("SELECT pg_replication_origin_create('upstream')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        conn.execute("INSERT INTO t VALUES (4, 'four', 'ok')")
        conn.execute("SELECT pg_replication_origin_session_reset()")
    big = "INSERT INTO t SELECT g, repeat('x', 200), 'ok' FROM generate_series({}, {}) g"
    with psycopg.connect(dsn) as conn:  # streamed, with a rolled-back subtransaction
        conn.execute(big.format(1000, 2999))
        conn.execute("SAVEPOINT a")
        conn.execute(big.format(3000, 4999))
        conn.execute("ROLLBACK TO SAVEPOINT a")
        conn.execute(big.format(5000, 5999))


class MessageReader:
    """pgoutput messages of a slot (protocol v2, streaming, messages), parsed."""

    def __init__(self, dsn: str, slot: str) -> None:
        self.repl = ReplicationConnection(dsn, application_name="test-messages").open()
        self.repl.start(slot, options={"proto_version": "2", "publication_names": '"p"',
                                       "streaming": "on", "messages": "true"})
        self.messages: list[pgo.PgOutputMessage] = []
        self.in_stream = False

    def read_until(self, done: Any) -> None:
        """Read until ``done(message or wal_end)`` is true."""
        conn = self.repl.pgconn
        while True:
            nbytes, data = conn.get_copy_data(1)
            if nbytes > 0:
                if data[0] == ord("w"):
                    message = pgo.parse_message(bytes(data[25:]), in_stream=self.in_stream)
                    self.in_stream = isinstance(message, pgo.StreamStart) or (
                        self.in_stream and not isinstance(message, pgo.StreamStop))
                    self.messages.append(message)
                    if done(message):
                        return
                elif data[0] == ord("k"):
                    wal_end, _ = parse_keepalive(data)
                    if done(wal_end):
                        return
                    self.repl.send_status(written=wal_end, flushed=0, reply=True)
                continue
            assert nbytes == 0, conn.get_error_message()
            select.select([conn.socket], [], [], 0.2)
            conn.consume_input()

    def read_to(self, lsn: int) -> None:
        self.read_until(lambda m: isinstance(m, int) and m >= lsn)

    def close(self) -> None:
        self.repl.close()


def committed_changes(messages: list[pgo.PgOutputMessage]) -> list[tuple[str, str, Any]]:
    """(table, op, values) in commit order, streamed transactions re-assembled and aborted
    subtransactions left out; values as text, as test_decoding shows them."""
    relations: dict[int, pgo.Relation] = {}
    out: list[tuple[str, str, Any]] = []
    current: list[tuple[int | None, tuple[str, str, Any]]] = []
    streamed: dict[int, list[tuple[int | None, tuple[str, str, Any]]]] = {}
    stream_xid: int | None = None

    def row(rel: pgo.Relation, values: tuple[Any, ...], *, only_key: bool = False) -> Any:
        return {c.name: None if v is None else v.decode()
                for c, v in zip(rel.columns, values, strict=True)
                if not only_key or c.key or rel.replica_identity == "f"}

    for m in messages:
        target = current if stream_xid is None else streamed.setdefault(stream_xid, [])
        if isinstance(m, pgo.Relation):
            relations[m.relid] = m
        elif isinstance(m, pgo.Insert):
            rel = relations[m.relid]
            target.append((m.xid, (f"{rel.namespace}.{rel.name}", "INSERT", row(rel, m.new))))
        elif isinstance(m, pgo.Update):
            rel = relations[m.relid]
            target.append((m.xid, (f"{rel.namespace}.{rel.name}", "UPDATE", row(rel, m.new))))
        elif isinstance(m, pgo.Delete):
            rel = relations[m.relid]
            target.append((m.xid, (f"{rel.namespace}.{rel.name}", "DELETE",
                                   row(rel, m.old, only_key=True))))
        elif isinstance(m, pgo.Truncate):
            for relid in m.relids:
                rel = relations[relid]
                target.append((m.xid, (f"{rel.namespace}.{rel.name}", "TRUNCATE", None)))
        elif isinstance(m, pgo.Message) and m.transactional:
            target.append((m.xid, ("message", m.prefix, m.content.decode())))
        elif isinstance(m, pgo.Commit):
            out.extend(change for _, change in current)
            current.clear()
        elif isinstance(m, pgo.StreamStart):
            stream_xid = m.xid
        elif isinstance(m, pgo.StreamStop):
            stream_xid = None
        elif isinstance(m, pgo.StreamAbort):
            if m.subxid == m.xid:
                streamed.pop(m.xid, None)
            else:
                streamed[m.xid] = [c for c in streamed.get(m.xid, []) if c[0] != m.subxid]
        elif isinstance(m, pgo.StreamCommit):
            out.extend(change for _, change in streamed.pop(m.xid, []))
    return out


def changes_of_test_decoding(lines: list[str]) -> list[tuple[str, str, Any]]:
    out: list[tuple[str, str, Any]] = []
    for line in lines:
        if line.startswith("message: transactional: 1"):
            prefix = line.split("prefix: ", 1)[1].split(",", 1)[0]
            out.append(("message", prefix, line.split("content:", 1)[1]))
        elif line.startswith("table ") and ": TRUNCATE:" in line:
            tables = line.removeprefix("table ").split(": TRUNCATE:", 1)[0]
            out.extend((table, "TRUNCATE", None) for table in tables.split(", "))
        elif line.startswith("table "):
            head, _, rest = line.partition(": ")
            op, _, rest = rest.partition(": ")
            if " new-tuple: " in rest:
                rest = rest.split(" new-tuple: ", 1)[1]
            table, op, values = parse_test_decoding(f"{head}: {op}: {rest}")
            out.append((table, op, values))
    return out


def test_every_message_type_matches_test_decoding(pg: TestDatabase) -> None:
    execute(
        pg.dsn,
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE TABLE t (id int PRIMARY KEY, v text, m mood)",
        "CREATE TABLE full_t (id int PRIMARY KEY, v text)",
        "ALTER TABLE full_t REPLICA IDENTITY FULL",
        "CREATE PUBLICATION p FOR TABLE t, full_t",
        # small enough that the two big transactions are streamed before they commit
        sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '64kB'").format(
            sql.Identifier(pg.name)),
        "SELECT pg_create_logical_replication_slot('raw', 'pgoutput')",
        "SELECT pg_create_logical_replication_slot('td', 'test_decoding')",
    )
    workload(pg.dsn)
    reader = MessageReader(pg.dsn, "raw")
    try:
        reader.read_to(wal_insert_lsn(pg.dsn))
        # A big transaction streamed while it runs, then rolled back: Stream Abort of the
        # top-level transaction (an abort decoded after the fact is simply dropped).
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("INSERT INTO t SELECT g, repeat('y', 200), 'ok' "
                         "FROM generate_series(7000, 9999) g")
            conn.execute("SELECT pg_switch_wal()")  # flush it so the walsender decodes it
            reader.read_until(lambda m: isinstance(m, pgo.StreamStop))
            conn.rollback()
        execute(pg.dsn, "INSERT INTO t VALUES (10000, 'last', 'ok')")
        reader.read_to(wal_insert_lsn(pg.dsn))
    finally:
        reader.close()
    messages = reader.messages

    kinds = {type(m).__name__ for m in messages}
    assert kinds >= {"Begin", "Commit", "Origin", "Relation", "Type", "Insert", "Update",
                     "Delete", "Truncate", "Message", "StreamStart", "StreamStop",
                     "StreamCommit", "StreamAbort"}
    updates = {m.old_kind for m in messages if isinstance(m, pgo.Update)}
    assert updates == {None, "K", "O"}
    assert {m.old_kind for m in messages if isinstance(m, pgo.Delete)} == {"K", "O"}
    aborts = [m for m in messages if isinstance(m, pgo.StreamAbort)]
    assert any(a.subxid != a.xid for a in aborts) and any(a.subxid == a.xid for a in aborts)
    assert any(isinstance(m, pgo.Message) and not m.transactional for m in messages)
    truncates = [m for m in messages if isinstance(m, pgo.Truncate)]
    assert len(truncates) == 1 and len(truncates[0].relids) == 2
    assert [m.name for m in messages if isinstance(m, pgo.Origin)] == ["upstream"]
    assert {(m.namespace, m.name) for m in messages if isinstance(m, pgo.Type)} == {
        ("public", "mood")}

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(SESSION)
        lines = [r[0] for r in conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('td', NULL, NULL, "
            "'skip-empty-xacts', '1')").fetchall()]
    expected = changes_of_test_decoding(lines)
    ours = committed_changes(messages)
    assert len(ours) == len(expected) == 15 + 3000  # 2000 + 1000 rows survive the savepoint
    assert ours == expected
