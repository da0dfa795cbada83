"""Sealed segments: complete ranges of the log stored columnar, read instead of rows, dropped
with a deleted stream's events and sealed again; sealing against deletions and crashes."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from lakefold.eventstore import EventStore, EventStoreNotInstalledError, StoreOptions, StreamEvents
from lakefold.eventstore._ddl import SEAL_LOCK_KEY
from lakefold.eventstore._sealer import BackgroundSealer, seal
from lakefold.eventstore._segments import decode, unsealed_ranges
from lakefold.eventstore.arrow import (
    EVENTS_ARROW_SCHEMA,
    PAYLOAD_FIELDS,
    events_schema,
    read_events_range,
)
from lakefold.schemas import NewEvent
from tests.fixtures.postgres import TestDatabase

SIZE = 8  # positions per segment in these tests
MANUAL = StoreOptions(seal_segments=False, segment_positions=SIZE)


def _table(batches: Iterable[pa.RecordBatch], schema: pa.Schema = EVENTS_ARROW_SCHEMA
           ) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=schema)


def _segments(dsn: str) -> list[tuple[int, int, int, pa.Table]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT first_position, end_position, events, data "
                            "FROM lakefold.event_segments ORDER BY 1").fetchall()
    return [(a, b, n, decode(pa.py_buffer(data))) for a, b, n, data in rows]


def _fill(dsn: str, events: int = 60) -> None:
    """``events`` events over six streams of two categories, with varied payloads."""
    with EventStore(dsn, options=MANUAL) as store:
        store.install()
        for i in range(events):
            stream = f"order-{i % 4}" if i % 3 else f"invoice-{i % 2}"
            store.append(stream, [NewEvent("order.placed" if i % 3 else "invoice.sent",
                                           {"i": i, "text": "ünï\nline"})])
        store.head()


@pytest.fixture
def filled(pg: TestDatabase) -> str:
    _fill(pg.dsn)
    return pg.dsn


@given(bounds=st.lists(st.integers(0, 12), unique=True).map(sorted),
       head=st.integers(0, 120), size=st.integers(1, 9))
def test_unsealed_ranges_fill_every_complete_block_gap_once(bounds: list[int], head: int,
                                                            size: int) -> None:
    segments = [(k * size + 1, (k + 1) * size + 1) for k in bounds]
    todo = unsealed_ranges(segments, head, size)
    covered = [p for a, b in segments for p in range(a, b)]
    sealed = [p for a, b in todo for p in range(a, b)]
    complete = head // size * size
    assert sorted(set(sealed)) == sealed  # in order, no overlap
    assert not set(sealed) & set(covered)
    assert set(sealed) == set(range(1, complete + 1)) - set(covered)
    for a, b in todo:  # never across a block boundary
        assert (a - 1) // size == (b - 2) // size


def test_a_sealed_read_returns_what_the_rows_return(filled: str) -> None:
    ranges = [(1, 61), (1, 9), (3, 17), (8, 9), (9, 41), (40, 61), (55, 200), (100, 200)]
    columns = [None, ["position"], ["data", "stream_id"], ["recorded_at", "event_id", "type"]]
    before = {(r, i): _table(read_events_range(filled, *r, columns=c), events_schema(c))
              for r in ranges for i, c in enumerate(columns)}
    with EventStore(filled, options=MANUAL) as store:
        sealed = store.seal()
        assert (sealed.segments, sealed.events, sealed.head) == (7, 56, 60)
        assert store.seal().segments == 0  # nothing left: the tail is incomplete
    assert [(a, b, n) for a, b, n, _ in _segments(filled)] == [
        (k * SIZE + 1, (k + 1) * SIZE + 1, SIZE) for k in range(7)]
    for (r, i), expected in before.items():
        got = _table(read_events_range(filled, *r, columns=columns[i], batch_size=5),
                     expected.schema)
        assert got.equals(expected), (r, columns[i])
        assert all(b.num_rows <= 5 for b in read_events_range(filled, *r, batch_size=5))
    payloads = [json.loads(d) for d in _table(read_events_range(filled, 1, 61))["data"].to_pylist()]
    assert payloads == [{"i": i, "text": "ünï\nline"} for i in range(60)]


def test_segments_hold_the_payloads_scalar_fields_parsed(pg: TestDatabase) -> None:
    _fill(pg.dsn, events=16)  # positions 1-16: {"i": position - 1, "text": ...}
    with EventStore(pg.dsn, options=MANUAL) as store:
        # 17-24: a nested field too, which stays in the text only
        store.append("order-9", [NewEvent("order.placed", {"i": n, "text": "ünï\nline",
                                                           "nested": {"a": [1]}})
                                 for n in range(16, 24)])
        # 25-32: a field that is a string in one payload and a number in the others
        store.append("order-9", [NewEvent("order.placed", {"i": "twenty-four"})]
                     + [NewEvent("order.placed", {"i": n}) for n in range(25, 32)])
        assert store.seal().segments == 4
    batches = list(read_events_range(pg.dsn, 1, 40, columns=["position", "data"],
                                     shredded=True))
    with_fields = [b for b in batches if PAYLOAD_FIELDS in b.schema.names]
    assert [b.column("position")[0].as_py() for b in with_fields] == [1, 9, 17]
    for batch in with_fields:
        fields = batch.column(PAYLOAD_FIELDS)
        assert fields.type == pa.struct([("i", pa.int64()), ("text", pa.string())])
        assert fields.to_pylist() == [{"i": p - 1, "text": "ünï\nline"}
                                      for p in batch.column("position").to_pylist()]
    unshredded = pa.Table.from_batches(
        [b.select(["position", "data"]) for b in batches])
    assert unshredded.equals(_table(read_events_range(pg.dsn, 1, 40, columns=["position",
                                                                              "data"]),
                                    events_schema(["position", "data"])))
    assert all(PAYLOAD_FIELDS not in b.schema.names
               for b in read_events_range(pg.dsn, 1, 40))  # only when asked for


def test_deleting_a_stream_drops_its_segments_and_sealing_restores_them(filled: str) -> None:
    with EventStore(filled, options=MANUAL) as store:
        store.seal()
        store.delete_stream("order-1")  # soft: events hidden
        store.delete_stream("invoice-0", hard=True)  # erased
        expected = [(e.position, e.stream_id, e.data) for e in store.read_all(0, 1000)]
        left = {a for a, _, _, _ in _segments(filled)}
        # every segment held an event of one of them
        assert left == set()
        got = _table(read_events_range(filled, 1, 100))
        assert list(zip(got["position"].to_pylist(), got["stream_id"].to_pylist(),
                        [json.loads(d) for d in got["data"].to_pylist()],
                        strict=True)) == expected
        resealed = store.seal()
        assert resealed.segments == 7
    held = {s for _, _, _, table in _segments(filled) for s in table["stream_id"].to_pylist()}
    assert "invoice-0" not in held
    assert [e for _, _, _, t in _segments(filled)
            for e in zip(t["stream_id"].to_pylist(), t["type"].to_pylist(), strict=True)
            if e[0] == "order-1"] == []
    again = _table(read_events_range(filled, 1, 100))
    assert again.equals(got)


def _stream_events(table: pa.Table, stream_id: str) -> list[str]:
    """The types of ``stream_id``'s events in ``table``."""
    return [t for s, t in zip(table["stream_id"].to_pylist(), table["type"].to_pylist(),
                              strict=True) if s == stream_id]


def test_a_deletion_under_way_makes_sealing_wait_and_never_misses_the_new_segment(
        filled: str) -> None:
    with psycopg.connect(filled) as deleting:
        deleting.execute("SELECT lakefold.delete_stream('order-2', NULL, false, "
                         "gen_random_uuid())")
        assert seal(filled, size=SIZE).interrupted  # the deletion holds the lock
        assert _segments(filled) == []
        deleting.commit()
    assert seal(filled, size=SIZE).segments == 7
    assert all(_stream_events(t, "order-2") == [] for _, _, _, t in _segments(filled))
    # what remains of order-2 is its deletion record, after the sealed blocks
    assert _stream_events(_table(read_events_range(filled, 1, 100)), "order-2") == [
        "$stream.deleted"]


def test_a_seal_before_a_deletion_is_dropped_by_it(filled: str) -> None:
    """A sealer that took the lock first finishes; the deletion waits for it, then sees and
    drops the segments it wrote (READ COMMITTED: the statement's snapshot follows the lock)."""
    with psycopg.connect(filled) as sealing:
        sealing.execute("SELECT pg_advisory_xact_lock(%s)", (SEAL_LOCK_KEY,))
        done = threading.Event()

        def delete() -> None:
            with EventStore(filled, options=MANUAL) as store:
                store.delete_stream("order-3")
            done.set()

        thread = threading.Thread(target=delete)
        thread.start()
        assert not done.wait(1.0)  # waits for the "sealer"
        sealing.execute("INSERT INTO lakefold.event_segments (first_position, end_position, "
                        "events, data) SELECT %s, %s, 0, %s", (1, SIZE + 1, b""))
        sealing.commit()
        thread.join(30)
    assert done.is_set()
    assert _segments(filled) == []  # position 8 is order-3's: the deletion dropped it


def test_deleting_outside_read_committed_is_refused(filled: str) -> None:
    with psycopg.connect(filled) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(psycopg.Error, match="READ COMMITTED") as caught:
            conn.execute("SELECT lakefold.delete_stream('order-2', -3, false, "
                         "gen_random_uuid())")
        assert caught.value.sqlstate == "LF011"


def test_concurrent_sealers_write_each_segment_once(filled: str) -> None:
    results = []
    threads = [threading.Thread(target=lambda: results.append(seal(filled, size=SIZE)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a sealer that finds another one at work stops (interrupted); a later run finishes
    written = sum(r.segments for r in results) + seal(filled, size=SIZE).segments
    assert written == 7
    assert [(a, n) for a, _, n, _ in _segments(filled)] == [(k * SIZE + 1, SIZE)
                                                             for k in range(7)]


def test_the_background_sealer_seals_as_the_log_grows(pg: TestDatabase) -> None:
    options = StoreOptions(segment_positions=SIZE)  # sealing on
    with EventStore(pg.dsn, options=options) as store:
        store.install()
        for i in range(5):
            store.append(f"order-{i}", [NewEvent("order.placed", {"i": k}) for k in range(9)])
        deadline = time.monotonic() + 20
        while len(_segments(pg.dsn)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(a, n) for a, _, n, _ in _segments(pg.dsn)] == [(k * SIZE + 1, SIZE)
                                                                for k in range(5)]
        store.delete_stream("order-0")  # its events are in the first two segments
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stream_ids = {s for _, _, _, t in _segments(pg.dsn)
                          for s, k in zip(t["stream_id"].to_pylist(), t["type"].to_pylist(),
                                          strict=True) if k != "$stream.deleted"}
            if len(_segments(pg.dsn)) == 5 and "order-0" not in stream_ids:
                break
            time.sleep(0.05)
        assert len(_segments(pg.dsn)) == 5 and "order-0" not in stream_ids


def test_a_store_without_segments_table_says_to_upgrade(filled: str,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    with psycopg.connect(filled, autocommit=True) as conn:
        conn.execute("DROP TABLE lakefold.event_segments")
    with pytest.raises(EventStoreNotInstalledError, match=r"older lakefold.*install"):
        list(read_events_range(filled, 1, 10))
    with pytest.raises(EventStoreNotInstalledError, match="install"):
        seal(filled, size=SIZE)
    sealer = BackgroundSealer(filled, size=SIZE)
    sealer.poke()
    deadline = time.monotonic() + 10
    while "not sealed" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    sealer.close()
    assert "event segments are not sealed" in caplog.text and "install" in caplog.text
    with EventStore(filled, options=MANUAL) as store:
        store.install()  # upgrades: the table is back
        assert store.seal().segments == 7


SEALER = """
import sys
from lakefold.eventstore._sealer import seal
print("ready", flush=True)
while seal(sys.argv[1], size=int(sys.argv[2])).segments:
    pass
"""


@pytest.mark.timeout(240)
def test_sigkilled_sealers_leave_whole_segments_that_equal_the_rows(pg: TestDatabase) -> None:
    """A sealer killed at random moments, while streams are deleted between runs, leaves
    every segment whole and equal, row for row, to the log it stands for."""
    rng = random.Random(7)
    size = 16
    with EventStore(pg.dsn, options=StoreOptions(seal_segments=False)) as store:
        store.install()
        for k in range(0, 1000, 100):
            store.append_streams([StreamEvents(f"acct-{i}", [NewEvent("deposited", {"n": n})
                                                             for n in range(30)])
                                  for i in range(k, k + 100)])
        store.head()
        kills = 0
        for round_ in range(12):
            with subprocess.Popen([sys.executable, "-c", SEALER, pg.dsn, str(size)],
                                  stdout=subprocess.PIPE) as child:
                assert child.stdout is not None and child.stdout.readline() == b"ready\n"
                time.sleep(rng.uniform(0.0, 0.6))
                if child.poll() is None:
                    child.send_signal(signal.SIGKILL)
                    kills += 1
            store.delete_stream(f"acct-{round_ * 7}", hard=round_ % 2 == 0)
        assert kills >= 10
        subprocess.run([sys.executable, "-c", SEALER, pg.dsn, str(size)], check=True,
                       stdout=subprocess.DEVNULL)
        head = store.head()
        segments = _segments(pg.dsn)
        assert [a for a, _, _, _ in segments] == list(range(1, head // size * size, size))
        for first, end, events, table in segments:
            expected = store.read_all(first, 10 * size, to_position=end)
            assert events == table.num_rows == len(expected)
            assert table["position"].to_pylist() == [e.position for e in expected]
            assert table["event_id"].to_pylist() == [str(e.event_id) for e in expected]
            assert table["stream_id"].to_pylist() == [e.stream_id for e in expected]
            assert [json.loads(d) for d in table["data"].to_pylist()] == [
                e.data for e in expected]
