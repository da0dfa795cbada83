"""PostgreSQL-only behaviour: the watermark, transactions with the caller's own writes,
races, lost acknowledgements, indexes, and errors at the boundary."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from lakefold.eventstore import (
    NO_STREAM,
    EventStore,
    EventStoreNotInstalledError,
    EventStoreUnavailableError,
    IdempotencyConflictError,
    InvalidRequestError,
    StoreOptions,
    StreamEvents,
    SubscriptionOptions,
    WatermarkHeldError,
    WrongExpectedVersionError,
    list_event_types,
)
from lakefold.eventstore._copy import COPY_THRESHOLD
from lakefold.eventstore._model import build_appends
from lakefold.eventstore._postgres import _APPEND, PostgresRecorder, append_params
from lakefold.eventstore._reads import ENVELOPE_COLUMNS, log_statement
from lakefold.local import free_port
from lakefold.schemas import EventEnvelope, EventMetadata, NewEvent
from tests.fixtures.postgres import TestDatabase


def ev(type_: str = "order.placed", **data: object) -> NewEvent:
    return NewEvent(type=type_, data=data or {"n": 1})


@pytest.fixture
def store(pg: TestDatabase) -> Iterator[EventStore]:
    with EventStore(pg.dsn, options=StoreOptions(watermark_threshold_s=0.3)) as store:
        store.install()
        yield store


def _backend_pid(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(60)
def test_long_writer_delays_visibility_but_never_causes_a_skip(
    store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.wait_for_positions(store.append("order-0", [ev(n=0)]))
    opened, release = threading.Event(), threading.Event()
    slow_pid: list[int] = []

    def slow_writer() -> None:
        with store.transaction() as tx:
            tx.append("order-slow", [ev(n=1), ev(n=2)])
            slow_pid.append(_backend_pid(tx.connection))
            tx.connection.execute("SELECT 'the slow writer' AS marker")
            opened.set()
            release.wait(30)

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert opened.wait(10)
    received: list[tuple[int | None, str]] = []
    with store.tail(SubscriptionOptions(poll_interval_s=0.1)) as tail:
        fast = store.append("order-fast", [ev(n=3)])  # commits while the slow one is open
        assert store.read_stream("order-fast")[0].position is None  # stream reads see it now
        assert store.head() == 1  # but global readers do not, yet
        with caplog.at_level(logging.WARNING, logger="lakefold.eventstore._sequencer"):
            time.sleep(0.5)
            status = store.status()
            assert status.held and status.pending_events == 1
            assert status.holder is not None and status.holder.pid == slow_pid[0]
            assert "the slow writer" in (status.holder.query or "")
            assert status.holder.held_for_s >= 0.3
            assert status.as_dict()["holder"]["pid"] == slow_pid[0]
            # the statement (which can hold secrets) is in no output: text, JSON, logs, errors
            assert "slow writer" not in status.holder.describe()
            assert "slow writer" not in json.dumps(status.as_dict(), default=str)
            with pytest.raises(WatermarkHeldError, match=f"pid {slow_pid[0]}") as held:
                store.wait_for_positions(fast, timeout_s=0.2)
            assert "slow writer" not in str(held.value)
            deadline = time.monotonic() + 10
            while not any("held by pid" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "no watermark warning was logged"
                time.sleep(0.1)
            assert not any("slow writer" in r.getMessage() for r in caplog.records)
        release.set()
        thread.join()
        for event in tail.events(idle_timeout_s=1.0):
            received.append((event.position, event.stream_id))
    # The slow transaction started first (lower xid): its events come first; nothing skipped.
    assert received == [(2, "order-slow"), (3, "order-slow"), (4, "order-fast")]
    assert store.wait_for_positions(fast).positions == [4]
    assert not store.status().held


@pytest.mark.timeout(60)
def test_a_transaction_in_another_database_holds_the_watermark(
    store: EventStore, pg: TestDatabase
) -> None:
    with psycopg.connect(pg.server.admin_dsn) as foreign:
        foreign.execute("SELECT pg_current_xact_id()")  # takes an xid, holds it open
        pid = _backend_pid(foreign)
        appended = store.append("order-1", [ev()])
        time.sleep(0.4)
        status = store.status()
        assert status.held and status.holder is not None
        assert status.holder.pid == pid and status.holder.database == "postgres"
        assert store.read_all() == []
    assert store.wait_for_positions(appended).positions == [1]


def test_transaction_commits_appends_checkpoint_and_own_writes_together(
    store: EventStore, pg: TestDatabase
) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE totals (n int)")
    store.save_checkpoint("projector", 1)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction() as tx:
        tx.append("order-1", [ev()])
        tx.connection.execute("INSERT INTO totals VALUES (1)")
        tx.save_checkpoint("projector", 2)
        raise Boom
    assert store.read_stream("order-1") == []
    assert store.load_checkpoint("projector") == 1
    with store.transaction() as tx:
        store.append("order-1", [ev()])  # a concurrent append, outside the transaction
        with pytest.raises(WrongExpectedVersionError):  # leaves the transaction usable
            tx.append("order-1", [ev()], expected_version=NO_STREAM)
        result = tx.append("order-1", [ev(), ev()], expected_version=1)
        tx.connection.execute("INSERT INTO totals VALUES (2)")
        tx.save_checkpoint("projector", 3)
    assert result.stream_versions == {"order-1": 3}
    assert store.load_checkpoint("projector") == 3
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT n FROM totals").fetchall() == [(2,)]
    assert [e.position for e in store.read_all()] == [1, 2, 3]


def _race(store: EventStore, stream: str, expected: object, writers: int) -> list[object]:
    """``writers`` threads append to ``stream`` at the same moment; their outcomes."""
    barrier = threading.Barrier(writers)
    outcomes: list[object] = []
    lock = threading.Lock()

    def contend(i: int) -> None:
        barrier.wait()
        try:
            result: object = store.append(stream, [ev(writer=i), ev(writer=i)],
                                          expected_version=expected)  # type: ignore[arg-type]
        except WrongExpectedVersionError as e:
            result = e
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.timeout(60)
def test_expected_version_races_have_exactly_one_winner(store: EventStore) -> None:
    writers = 16
    for round_ in range(4):
        stream = f"race-{round_}"
        if round_ % 2:
            store.append(stream, [ev()], expected_version=NO_STREAM)
        outcomes = _race(store, stream, 1 if round_ % 2 else NO_STREAM, writers)
        losers = [o for o in outcomes if isinstance(o, WrongExpectedVersionError)]
        assert len(losers) == writers - 1
        final = 3 if round_ % 2 else 2
        assert {loser.actual_version for loser in losers} == {final}
        events = store.read_stream(stream)
        assert [e.stream_version for e in events] == list(range(1, final + 1))
        assert len({e.data["writer"] for e in events if "writer" in e.data}) == 1


class _LossyProxy:
    """A TCP proxy to the server that, once armed for one client port, swallows the next
    answer the server sends to that client and cuts the connection: the request was executed
    and committed, the acknowledgement is lost."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed_for: int | None = None
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, (_, client_port) = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, None),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, client_port),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, client_port: int | None
              ) -> None:
        try:
            while data := source.recv(65536):
                if client_port is not None and client_port == self.armed_for:
                    self.armed_for = None
                    self.dropped.set()
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [1, 3], ids=["one-event statement", "many-event statement"])
def test_idempotent_retry_after_a_lost_acknowledgement(store: EventStore, pg: TestDatabase,
                                                       count: int) -> None:
    assert pg.server.local is not None
    proxy = _LossyProxy(pg.server.local.port)
    via_proxy = pg.dsn.replace(f"port={pg.server.local.port}", f"port={proxy.port}")
    assert via_proxy != pg.dsn
    events = [ev(n=i) for i in range(count)]
    try:
        with EventStore(via_proxy) as flaky:
            # prepare the statement on the pooled connection
            flaky.append("warm-1", [ev() for _ in range(count)], expected_version=NO_STREAM)
            with flaky.recorder.connection() as conn:  # type: ignore[attr-defined]
                sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
                proxy.armed_for = sock.getsockname()[1]
                sock.close()
            with pytest.raises(EventStoreUnavailableError):  # the append ran; its answer was lost
                flaky.append("pay-1", events, expected_version=NO_STREAM)
            assert proxy.dropped.is_set()
            assert store.stream_state("pay-1").version == count  # it was committed
            retry = flaky.append("pay-1", events, expected_version=NO_STREAM)
    finally:
        proxy.close()
    assert retry.duplicate
    assert [(e.event_id, e.stream_version) for e in retry.events] == [
        (e.event_id, i) for i, e in enumerate(events, start=1)]
    assert len(store.read_stream("pay-1")) == count
    assert store.wait_for_positions(retry).positions == list(range(count + 1, 2 * count + 1))


def test_one_event_appends_prepare_their_statement_again_when_the_server_forgot_it(
        store: EventStore) -> None:
    metadata = EventMetadata(correlation_id=uuid.uuid4(), causation_id=uuid.uuid4(),
                             extra={"user": "ann"})
    first = store.append("order-9", [ev(n=1)], expected_version=NO_STREAM)
    with store.recorder.connection() as conn:  # type: ignore[attr-defined]
        pid = _backend_pid(conn)
        conn.execute("DEALLOCATE ALL")  # a server that forgot the connection's statements
    # the pool hands out the connection returned last: the one without statements
    second = store.append("order-9", [NewEvent("order.paid", {"n": 2}, metadata=metadata)],
                          expected_version=1)
    with pytest.raises(WrongExpectedVersionError):
        store.append("order-9", [ev(n=3)], expected_version=1)
    with store.recorder.connection() as conn:  # type: ignore[attr-defined]
        assert _backend_pid(conn) == pid
        prepared = {row[0] for row in conn.execute("SELECT name FROM pg_prepared_statements")}
    assert "lakefold_append_one_exact" in prepared
    assert [(e.stream_id, e.stream_version) for e in first.events + second.events] == [
        ("order-9", 1), ("order-9", 2)]
    stored = store.read_stream("order-9")
    assert [(e.type, e.data, e.stream_version) for e in stored] == [
        ("order.placed", {"n": 1}, 1), ("order.paid", {"n": 2}, 2)]
    assert stored[1].metadata == metadata


def _plan(conn: psycopg.Connection, statement: sql.Composed, params: dict[str, object]) -> str:
    rows = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS OFF, TIMING OFF, COSTS OFF) ")
                        + statement, params).fetchall()
    return "\n".join(row[0] for row in rows)


@pytest.mark.timeout(120)
def test_category_and_type_reads_use_their_indexes(store: EventStore, pg: TestDatabase) -> None:
    # alternating types: every noise event is a run of its own, 20k runs to walk past
    for batch in range(20):
        store.append(f"noise-{batch}", [ev(f"noise.{'made' if i % 2 else 'seen'}")
                                        for i in range(1000)])
    store.append("rare-1", [ev("rare.seen"), ev("rare.seen")])
    assert store.head() == 20_002
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("ANALYZE lakefold.event_positions")
        conn.execute("ANALYZE lakefold.events")
        conn.execute("ANALYZE lakefold.event_runs")
        params = {"from": 1, "to": 2**62, "limit": 100, "category": "rare",
                  "types": ["rare.seen", "$stream.deleted"]}
        category_plan = _plan(conn, log_statement(
            ENVELOPE_COLUMNS, category=True, types=False, include_deleted=False,
            bounded=False), params)
        types_plan = _plan(conn, log_statement(
            ENVELOPE_COLUMNS, category=False, types=True, include_deleted=False,
            bounded=True), params)
        # a page of a large category walks as many runs as the page needs, not the category
        page_plan = _plan(conn, log_statement(
            ENVELOPE_COLUMNS, category=True, types=False, include_deleted=False,
            bounded=False), {**params, "from": 5000, "category": "noise"})
    runs = [line for line in page_plan.splitlines() if " on event_runs r " in line]
    assert runs and max(float(n) for n in re.findall(r"actual rows=([0-9.]+)",
                                                     "".join(runs))) <= 100, page_plan
    assert "rows=100.00 loops=1" in page_plan.splitlines()[0], page_plan
    for plan, index in ((category_plan, "event_runs_category_idx"),
                        (types_plan, "event_runs_type_idx")):
        assert index in plan, plan
        # one position lookup per event read, never a pass over every transaction's row
        assert "Seq Scan on events" not in plan and "Hash Join" not in plan, plan
        assert "Nested Loop" in plan, plan
        # the scans of events touch only what is read, not the 20k other events
        scans = [line for line in plan.splitlines() if " on events e " in line]
        assert scans, plan
        assert max(float(n) for n in re.findall(r"actual rows=([0-9.]+)", "".join(scans))) \
            <= 2, plan
    assert [e.stream_id for e in store.read_category("rare")] == ["rare-1", "rare-1"]


def _mixed_appends(store: EventStore) -> None:
    """Events through every append path, with runs of types and categories to split."""
    store.append("a-1", [ev("x.one")])  # one event: the prepared statement
    store.append("a-2", [ev("x.one"), ev("x.one"), ev("x.two"), ev("x.one")])  # one stream
    store.append_streams([  # several streams: lakefold.append_events
        StreamEvents("b-1", [ev("x.one"), ev("x.two")]), StreamEvents("a-3", [ev("x.two")]),
        StreamEvents("a-4", [ev("x.two"), ev("x.one")])])
    store.append_streams([  # COPY
        StreamEvents("a-5", [ev("x.one") for _ in range(150)] + [ev("x.two")]),
        StreamEvents("a-6", [ev("x.two") for _ in range(60)] + [ev("x.three")]),
        StreamEvents("b-2", [ev("x.two") for _ in range(COPY_THRESHOLD)])])
    with store.transaction() as unit:  # two appends, one transaction: ordinals go on
        unit.append("b-3", [ev("x.one")])
        unit.append("a-7", [ev("x.one"), ev("x.four")])
    store.delete_stream("b-1")
    store.delete_stream("a-6", hard=True)  # x.three was only there


def _check_runs(conn: psycopg.Connection) -> None:
    """Every event lies in exactly one run, of its own category, type and deletion state."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE n <> 1), count(*) FROM (SELECT (SELECT count(*) "
        "FROM lakefold.event_runs r WHERE r.xid = e.xid AND e.ordinal BETWEEN r.first_ordinal "
        "AND r.last_ordinal AND r.category = e.category AND r.type = e.type) AS n "
        "FROM lakefold.events e) c").fetchone()
    assert row is not None and row[0] == 0 and row[1] > 0, row
    mismatched = conn.execute(
        "SELECT count(*) FROM lakefold.event_runs r JOIN lakefold.events e ON e.xid = r.xid "
        "AND e.ordinal BETWEEN r.first_ordinal AND r.last_ordinal "
        "WHERE (e.category, e.type, e.deleted) <> (r.category, r.type, r.deleted)").fetchone()
    assert mismatched == (0,)
    # ... and every run holds events of one stream, at least one
    odd_runs = conn.execute(
        "SELECT count(*) FROM lakefold.event_runs r WHERE (SELECT count(DISTINCT e.stream_id) "
        "FROM lakefold.events e WHERE e.xid = r.xid "
        "AND e.ordinal BETWEEN r.first_ordinal AND r.last_ordinal) <> 1").fetchone()
    assert odd_runs == (0,)


def _filtered_reads(store: EventStore) -> dict[str, list[tuple[str, int, int | None]]]:
    """Category and type reads, whole and in pages that start and end inside runs, each
    checked against a filter of the whole log."""
    everything = store.read_all(limit=10_000, include_deleted=True)

    def hidden(e: EventEnvelope) -> bool:  # by the soft delete of b-1
        return e.stream_id == "b-1" and e.type != "$stream.deleted"

    found: dict[str, list[tuple[str, int, int | None]]] = {}
    for category in ("a", "b"):
        for types in (None, ["x.one"], ["x.two", "x.four"]):
            for deleted in (False, True):
                wanted = [e for e in everything if e.stream_id.startswith(f"{category}-")
                          and (types is None or e.type in types or e.type == "$stream.deleted")
                          and (deleted or not hidden(e))]
                got = store.read_category(category, types=types, limit=10_000,
                                          include_deleted=deleted)
                assert [e.position for e in got] == [e.position for e in wanted]
                found[f"{category} {types} {deleted}"] = [
                    (e.stream_id, e.stream_version, e.position) for e in got]
    for types in (["x.one"], ["x.two", "x.three"]):
        wanted = [e for e in everything if (e.type in types or e.type == "$stream.deleted")
                  and not hidden(e)]
        assert [e.position for e in store.read_all(types=types, limit=10_000)] == [
            e.position for e in wanted]
        found[f"all {types}"] = [(e.stream_id, e.stream_version, e.position) for e in wanted]
    # pages from and to positions inside the COPY append's runs
    a5 = [e.position or 0 for e in store.read_stream("a-5")]
    page = store.read_category("a", from_position=a5[10], to_position=a5[140], limit=50)
    assert [e.position for e in page] == a5[10:60]
    page = store.read_all(from_position=a5[100], types=["x.one"], to_position=a5[120])
    assert [e.position for e in page] == a5[100:120]
    return found


@pytest.mark.timeout(120)
def test_every_append_path_indexes_its_events_by_runs(store: EventStore,
                                                      pg: TestDatabase) -> None:
    _mixed_appends(store)
    # names that need quoting in the literals the COPY path sends with its COMMIT
    odd_category, odd_type = "o'd\\{x}\t,\"y\"", "t'{1,2}\\n"
    store.append(f"{odd_category}-1", [ev(odd_type) for _ in range(COPY_THRESHOLD)])
    with psycopg.connect(pg.dsn) as conn:
        _check_runs(conn)
        runs = conn.execute("SELECT count(*) FROM lakefold.event_runs").fetchone()
        deleted = conn.execute("SELECT count(*) FROM lakefold.event_runs WHERE deleted"
                               ).fetchone()
        odd = conn.execute("SELECT category, type FROM lakefold.event_runs "
                           "WHERE category NOT IN ('a', 'b')").fetchall()
    assert odd == [(odd_category, odd_type)]
    assert len(store.read_category(odd_category)) == COPY_THRESHOLD
    assert [e.type for e in store.read_all(types=[odd_type])] == ["$stream.deleted"] * 2 + [
        odd_type] * COPY_THRESHOLD  # type reads always include deletion records
    # one run per stream and stretch of one type: a-1 1, a-2 3, append_events 2 + 1 + 2,
    # COPY 2 + 2 + 1, the transaction 1 + 2, the deletion records 2, the odd names 1; less
    # the 2 runs of the hard-deleted a-6
    assert runs == (1 + 3 + 5 + 5 + 3 + 2 + 1 - 2,)
    assert deleted == (2,)  # the soft-deleted b-1's two runs
    _filtered_reads(store)
    assert list_event_types(pg.dsn) == ["$stream.deleted", odd_type, "x.four", "x.one",
                                        "x.two"]
    assert list_event_types(pg.dsn, "b") == ["$stream.deleted", "x.one", "x.two"]


@pytest.mark.timeout(120)
def test_install_moves_a_store_indexed_per_event_to_runs(store: EventStore,
                                                          pg: TestDatabase) -> None:
    """A store installed before runs existed indexed category and type per event: install()
    builds its runs from its events and drops those indexes, and reads stay the same."""
    _mixed_appends(store)
    before = _filtered_reads(store)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE lakefold.event_runs")
        conn.execute("CREATE INDEX events_category_idx ON lakefold.events "
                     "(category, xid, ordinal)")
        conn.execute("CREATE INDEX events_type_idx ON lakefold.events (type, xid, ordinal)")
        store.install()
        store.install()  # idempotent
        _check_runs(conn)
        left = conn.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = 'lakefold' "
                            "AND indexname IN ('events_category_idx', 'events_type_idx')"
                            ).fetchone()
    assert left == (0,)
    assert _filtered_reads(store) == before


@pytest.mark.timeout(120)
def test_sequencing_rounds_never_scan_the_whole_log(store: EventStore, pg: TestDatabase) -> None:
    """Under the generic plans PL/pgSQL switches to, a round with nothing to do (the usual
    case) must not read every event: once it did, at every round, for every writer."""
    for batch in range(20):
        store.append(f"bulk-{batch}", [ev() for _ in range(1000)])
    assert store.head() == 20_000
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("ANALYZE lakefold.events")
        conn.execute("ANALYZE lakefold.event_runs")
        conn.execute("SET plan_cache_mode = force_generic_plan")

        def scans() -> tuple[int, int]:
            conn.execute("SELECT pg_stat_force_next_flush()")
            row = conn.execute("SELECT seq_scan, seq_tup_read FROM pg_stat_user_tables "
                               "WHERE relid = 'lakefold.events'::regclass").fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        before = scans()
        for _ in range(10):  # idle rounds, then rounds that sequence one new transaction
            assert conn.execute("SELECT * FROM lakefold.sequence_events(1000)").fetchone() \
                == (20_000, False, 0)
        store.append("bulk-new", [ev()])
        for _ in range(3):
            conn.execute("SELECT * FROM lakefold.sequence_events(1000)")
        assert store.head() == 20_001
        assert scans() == before


def test_the_pool_hands_out_the_connection_returned_last(pg: TestDatabase) -> None:
    """Once the pool has grown, one caller keeps getting the same (warm) server process
    instead of going round all of them."""
    with EventStore(pg.dsn, options=StoreOptions(pool_size=4)) as store:
        recorder = store.recorder
        assert isinstance(recorder, PostgresRecorder)
        with contextlib.ExitStack() as held:  # four callers at once: the pool grows to four
            pids = {_backend_pid(held.enter_context(recorder.connection())) for _ in range(4)}
        assert len(pids) == 4
        with recorder.connection() as conn:
            last = _backend_pid(conn)
        for _ in range(6):
            with recorder.connection() as conn:
                assert _backend_pid(conn) == last


@pytest.mark.timeout(60)
def test_subscription_falls_back_to_polling_without_notify(store: EventStore,
                                                           pg: TestDatabase) -> None:
    params = append_params(build_appends([("order-7", [ev(n=7)], NO_STREAM)]))
    with store.tail(SubscriptionOptions(poll_interval_s=0.2)) as tail:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:  # a writer with no sequencer
            conn.execute(_APPEND, params)
        started = time.monotonic()
        got = next(tail.events(idle_timeout_s=5.0))
        assert got.data == {"n": 7} and got.position == 1
        assert time.monotonic() - started < 2.0


def test_sequencing_refuses_to_run_inside_a_transaction(store: EventStore,
                                                        pg: TestDatabase) -> None:
    for first in ("SELECT pg_current_xact_id()",
                  "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"):
        with psycopg.connect(pg.dsn) as conn:
            conn.execute(first)
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT * FROM lakefold.sequence_events(10)")
            assert info.value.sqlstate == "LF010"


def test_hard_delete_removes_the_rows(store: EventStore, pg: TestDatabase) -> None:
    store.append("user-1", [ev("user.joined", email="ann@example.com") for _ in range(3)])
    store.append("user-2", [ev("user.joined")])
    store.head()
    store.delete_stream("user-1", hard=True)
    assert store.head() == 5
    with psycopg.connect(pg.dsn) as conn:
        rows = conn.execute(
            "SELECT type, data FROM lakefold.events WHERE stream_id = 'user-1'").fetchall()
    assert [r[0] for r in rows] == ["$stream.deleted"]
    assert "ann@example.com" not in json.dumps([r[1] for r in rows])
    # positions 1-3 are holes now; nothing else moved
    assert [e.position for e in store.read_all(include_deleted=True)] == [4, 5]


def test_missing_schema_and_unreachable_server_are_clear_errors(pg: TestDatabase) -> None:
    with EventStore(pg.dsn) as store:
        with pytest.raises(EventStoreNotInstalledError, match="lakefold events install"):
            store.append("order-1", [ev()])
        with pytest.raises(EventStoreNotInstalledError):
            store.read_all()
    dsn = f"host=127.0.0.1 port={free_port()} user=app password=hunter2 dbname=x"
    with pytest.raises(EventStoreUnavailableError) as info:
        EventStore(dsn, options=StoreOptions(connect_timeout_s=1))
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


@pytest.mark.timeout(60)
def test_head_is_never_stale_while_another_sequencer_runs(store: EventStore,
                                                          pg: TestDatabase) -> None:
    store.append("order-1", [ev(n=1)])
    with psycopg.connect(pg.dsn) as other:  # a sequencer caught mid-round, holding its xid
        other.execute("SELECT pg_advisory_xact_lock("
                      "'lakefold.event_sequencer'::regclass::oid::bigint), pg_current_xact_id()")
        store.append("order-1", [ev(n=2)])  # committed after that sequencer took its xid
        heads: list[int] = []
        reader = threading.Thread(target=lambda: heads.append(store.head()))
        reader.start()
        time.sleep(0.3)
        assert heads == []  # waits for the running round instead of answering stale
    reader.join(10)
    assert heads == [2]


def test_large_appends_by_copy_keep_every_guarantee(store: EventStore) -> None:
    assert COPY_THRESHOLD <= 250
    meta = EventMetadata(correlation_id=uuid.uuid4(), extra={"source": "import"})
    big = [NewEvent("order.placed", {"i": i}, metadata=meta if i % 2 else EventMetadata())
           for i in range(250)]
    first = store.append_streams([StreamEvents("order-1", big[:200], NO_STREAM),
                                  StreamEvents("order-2", big[200:], NO_STREAM)])
    assert first.stream_versions == {"order-1": 200, "order-2": 50}
    again = store.append_streams([StreamEvents("order-1", big[:200], NO_STREAM),
                                  StreamEvents("order-2", big[200:], NO_STREAM)])
    assert again.duplicate and again.stream_versions == first.stream_versions
    with pytest.raises(WrongExpectedVersionError) as info:
        store.append_streams([StreamEvents("order-3", [ev(i=i) for i in range(150)]),
                              StreamEvents("order-1", [ev(i=i) for i in range(100)], 5)])
    assert info.value.actual_version == 200
    assert not store.stream_state("order-3").exists  # nothing written
    with pytest.raises(IdempotencyConflictError):
        store.append("order-4", [*big[:10], *[ev(i=i) for i in range(240)]])
    assert not store.stream_state("order-4").exists
    with store.transaction() as tx:  # inside the caller's transaction, under a savepoint
        with pytest.raises(WrongExpectedVersionError):
            tx.append("order-1", [ev(i=i) for i in range(300)], expected_version=NO_STREAM)
        tx.append("order-5", [ev(i=i) for i in range(300)])
    events = store.read_all(0, 10_000)
    assert [e.position for e in events] == list(range(1, 551))
    assert [e.data["i"] for e in events[:250]] == list(range(250))
    assert events[1].metadata == meta and events[0].metadata == EventMetadata()
    assert store.read_stream("order-5")[-1].stream_version == 300


def test_an_invalid_event_in_the_middle_of_a_copy_stream_writes_nothing(
        store: EventStore, pg: TestDatabase) -> None:
    # Large appends are validated while COPY streams them: event 700 fails after hundreds of
    # rows reached the server, and the whole append (every stream of it) must still vanish.
    store.append("order-0", [ev(i=0)])
    good = [ev(i=i) for i in range(1000)]
    bad_data = [*good[:700], NewEvent("order.placed", {"bad": {1, 2}}), *good[701:]]
    with pytest.raises(InvalidRequestError, match=r"event #700 \(order\.placed\) data is not JSON"):
        store.append("order-1", bad_data)
    repeated_id = [*good[:500], NewEvent("order.placed", {}, event_id=good[3].event_id)]
    with pytest.raises(InvalidRequestError, match=f"event id {good[3].event_id} appears twice"):
        store.append_streams([StreamEvents("order-2", good[:300]),
                              StreamEvents("order-3", repeated_id[300:])])
    with store.transaction() as tx:  # under the caller's savepoint, which stays usable
        with pytest.raises(InvalidRequestError, match="event #999 is a str"):
            tx.append("order-4", [*good[:999], "not an event"])  # type: ignore[list-item]
        tx.append("order-5", [ev(i=i) for i in range(3)])
    with psycopg.connect(pg.dsn) as conn:
        rows = conn.execute("SELECT stream_id, count(*) FROM lakefold.events "
                            "GROUP BY stream_id ORDER BY 1").fetchall()
        streams = conn.execute("SELECT stream_id FROM lakefold.streams ORDER BY 1").fetchall()
    assert rows == [("order-0", 1), ("order-5", 3)]
    assert streams == [("order-0",), ("order-5",)]
    assert store.append("order-1", good).stream_versions == {"order-1": 1000}  # ids unused


def test_one_event_appends_store_text_right_whatever_client_encoding_the_dsn_asks_for(
        pg: TestDatabase) -> None:
    with EventStore(f"{pg.dsn} client_encoding=LATIN1") as latin:
        latin.install()
        latin.append("order-zoë", [ev(name="Zoë pays 5 €")], expected_version=NO_STREAM)
        [stored] = latin.read_stream("order-zoë")
    assert (stored.stream_id, stored.data) == ("order-zoë", {"name": "Zoë pays 5 €"})
    with psycopg.connect(pg.dsn) as conn:  # as any other client sees it
        row = conn.execute("SELECT stream_id, data->>'name' FROM lakefold.events").fetchone()
    assert row == ("order-zoë", "Zoë pays 5 €")


# A process that appends one event to order-7 on its main thread and reports a Ctrl-C.
_INTERRUPTIBLE_APPENDER = """
import sys
from lakefold.eventstore import EventStore
from lakefold.schemas import NewEvent
with EventStore(sys.argv[1]) as store:
    try:
        store.append("order-7", [NewEvent("order.placed", {"n": 2})], expected_version=1)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
"""


@pytest.mark.timeout(90)
def test_ctrl_c_interrupts_a_one_event_append_waiting_for_a_lock(store: EventStore,
                                                                 pg: TestDatabase) -> None:
    # In a child process: an append that ignored Ctrl-C would hang the test run itself.
    store.append("order-7", [ev(n=1)], expected_version=NO_STREAM)
    with psycopg.connect(pg.dsn) as holder:  # another transaction holds the stream's row
        holder.execute("SELECT 1 FROM lakefold.streams WHERE stream_id = 'order-7' FOR UPDATE")
        child = subprocess.Popen([sys.executable, "-c", _INTERRUPTIBLE_APPENDER, pg.dsn],
                                 stdout=subprocess.PIPE, text=True)
        try:
            with psycopg.connect(pg.dsn, autocommit=True) as watcher:
                deadline = time.monotonic() + 30
                while not watcher.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'WITH s AS (UPDATE lakefold.streams%'").fetchone():
                    assert time.monotonic() < deadline, "the append never waited for the lock"
                    time.sleep(0.02)
            child.send_signal(signal.SIGINT)
            out, _ = child.communicate(timeout=20)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert (child.returncode, out.strip()) == (3, "interrupted")
        holder.rollback()
    assert store.stream_state("order-7").version == 1  # the statement was cancelled
    store.append("order-7", [ev(n=3)], expected_version=1)  # and the store works on
    assert [e.data for e in store.read_stream("order-7")] == [{"n": 1}, {"n": 3}]


# Appends batches until killed: a large append to two streams (COPY, runs of two types) or a
# small one (lakefold.append_events), printing each acknowledged batch.
_KILLED_APPENDER = """
import sys
from lakefold.eventstore import EventStore, StreamEvents
from lakefold.schemas import NewEvent
dsn, first = sys.argv[1], int(sys.argv[2])
with EventStore(dsn) as store:
    for b in range(first, first + 100_000):
        n = 2_500 if b % 2 else 3
        store.append_streams([
            StreamEvents(f"k{b % 3}-{b}", [NewEvent(f"t.{i % 2}", {"b": b}) for i in range(n)]),
            StreamEvents(f"j-{b}", [NewEvent("t.x", {"b": b})])])
        print(b, flush=True)
"""


@pytest.mark.timeout(180)
def test_sigkilled_appenders_leave_whole_appends_and_their_runs(store: EventStore,
                                                                pg: TestDatabase) -> None:
    """An appender killed with SIGKILL at random moments (often inside a COPY) leaves each
    append whole or absent, with its runs; category and type reads agree with the log."""
    rng = random.Random(5)
    acknowledged: list[int] = []
    for round_ in range(6):
        with subprocess.Popen([sys.executable, "-c", _KILLED_APPENDER, pg.dsn,
                               str(round_ * 100_000)], stdout=subprocess.PIPE, text=True
                              ) as child:
            try:
                assert child.stdout is not None
                for _ in range(rng.randint(1, 8)):  # let it acknowledge a few batches first
                    acknowledged.append(int(child.stdout.readline()))
                time.sleep(rng.uniform(0, 0.05))
                child.send_signal(signal.SIGKILL)
                acknowledged += [int(line) for line in child.stdout.read().split()]
            finally:
                child.kill()
    with psycopg.connect(pg.dsn) as conn:
        counts: dict[int, int] = dict(conn.execute(
            "SELECT (data->>'b')::int, count(*) FROM lakefold.events GROUP BY 1").fetchall())
        _check_runs(conn)
    for b, stored in counts.items():
        assert stored == (2_500 if b % 2 else 3) + 1, (b, stored)  # whole or absent
    for round_ in range(6):  # each round stored its acknowledged appends, and at most the
        first = round_ * 100_000  # one in flight when it was killed, with no gap
        mine = sorted(b for b in counts if first <= b < first + 100_000)
        acked = [b for b in acknowledged if first <= b < first + 100_000]
        assert mine == list(range(first, first + len(mine))), mine
        assert len(acked) <= len(mine) <= len(acked) + 1, (acked, mine)
    everything = store.read_all(limit=100_000)
    for category in ("k0", "k1", "k2", "j"):
        assert [e.position for e in store.read_category(category, limit=100_000)] == [
            e.position for e in everything if e.stream_id.startswith(f"{category}-")]
    assert [e.position for e in store.read_all(types=["t.1"], limit=100_000)] == [
        e.position for e in everything if e.type == "t.1"]
