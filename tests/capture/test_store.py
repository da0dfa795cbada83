"""The read side of the changelog store: positions, ranges, schemas, tailing."""

from __future__ import annotations

import pickle
import threading
import time

import psycopg
import pyarrow as pa
import pytest

from lakefold.capture import (
    META_SCHEMA,
    Capture,
    CaptureConfig,
    ChangelogStore,
    StoreError,
    UnknownStreamError,
    read_changelog_range,
)
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def captured(pg: TestDatabase) -> str:
    """A stream public.t with 100 inserts (positions 1..100) and 20 updates (101..120)."""
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(8, 2))")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="reads")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, 100) g",
            "UPDATE t SET v = 'w' || id WHERE id <= 20")
    capture_now(config)
    return pg.dsn


def test_positions_start_at_one_and_from_position_is_inclusive(captured: str) -> None:
    with ChangelogStore(captured) as store:
        assert store.head("public.t") == 120
        everything = store.read("public.t", 0, 1_000)
        assert everything.column("_position").to_pylist() == list(range(1, 121))
        assert store.read("public.t", 1, 1_000).equals(everything)
        page = store.read("public.t", 50, 10)
        assert page.column("_position").to_pylist() == list(range(50, 60))
        assert store.read("public.t", 121, 10).num_rows == 0
        assert store.read("public.t", 121, 10).schema == everything.schema
        assert everything.schema.names[:len(META_SCHEMA)] == META_SCHEMA.names
        assert everything.schema.field("n").type == pa.decimal128(8, 2)
        assert everything.column("_op").to_pylist()[99:101] == ["insert", "update"]
        with pytest.raises(ValueError, match="limit"):
            store.read("public.t", 1, 0)


def test_unknown_stream_and_version_errors_list_what_exists(captured: str) -> None:
    with ChangelogStore(captured) as store:
        with pytest.raises(UnknownStreamError, match=r"known streams: public\.t"):
            store.read("public.nope")
        with pytest.raises(StoreError, match="versions: 1"):
            store.stream_schema("public.t", 7)
        column = store.stream_schema("public.t").columns[0]
        assert (column.name, column.type_oid, column.type_name, column.key) == (
            "id", 23, "int4", True)


def test_read_changelog_range_is_half_open_picklable_and_batched(captured: str) -> None:
    reader = pickle.loads(pickle.dumps(read_changelog_range))  # noqa: S301 - our own bytes
    batches = list(reader(captured, "public.t", 10, 60, batch_rows=16))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert len(batches) == 4
    positions = pa.Table.from_batches(batches).column("_position").to_pylist()
    assert positions == list(range(10, 60))
    capped = list(read_changelog_range(captured, "public.t", 110, 10_000))
    assert pa.Table.from_batches(capped).column("_position").to_pylist() == list(range(110, 121))
    assert list(read_changelog_range(captured, "public.t", 200, 300)) == []
    with ChangelogStore(captured) as store:
        whole = pa.Table.from_batches(read_changelog_range(captured, "public.t", 1, 121))
        assert whole.equals(store.read("public.t", 1, 1_000))


def test_follow_wakes_on_notify_and_falls_back_to_polling(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="tail")
    Capture(config).setup()
    execute(pg.dsn, "INSERT INTO t VALUES (1)")
    capture_now(config)
    stop = threading.Event()
    seen: list[tuple[int, float]] = []

    def follow(poll_interval: float) -> None:
        with ChangelogStore(pg.dsn) as store:
            for table in store.follow("public.t", 2, stop=stop, poll_interval=poll_interval):
                seen.extend((p, time.monotonic()) for p in table.column("_position").to_pylist())

    capture_stop = threading.Event()
    capturer = threading.Thread(target=lambda: Capture(config).run(stop=capture_stop))
    follower = threading.Thread(target=follow, args=(60.0,))  # only NOTIFY can wake it in time
    capturer.start()
    follower.start()
    try:
        time.sleep(0.5)
        committed = time.monotonic()
        execute(pg.dsn, "INSERT INTO t VALUES (2)")
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p for p, _ in seen] == [2]
        assert seen[0][1] - committed < 2.0
    finally:
        capture_stop.set()
        capturer.join(30)
        stop.set()
        execute(pg.dsn, "NOTIFY lakefold_changelog, 'public.t'")
        follower.join(30)
    assert not follower.is_alive() and not capturer.is_alive()

    # A head moved without NOTIFY (e.g. a notification lost) is found by polling.
    seen.clear()
    stop.clear()
    follower = threading.Thread(target=follow, args=(0.2,))
    follower.start()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO lakefold.changelog SELECT stream_id, 3, 1, commit_lsn + 1, "
                     "xid, commit_ts, schema_version, op, key, before, after "
                     "FROM lakefold.changelog WHERE position = 2")
        conn.execute("UPDATE lakefold.changelog_streams SET head = 3")
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    follower.join(30)
    assert [p for p, _ in seen] == [2, 3]


def test_empty_store_has_no_streams(pg: TestDatabase) -> None:
    with ChangelogStore(pg.dsn) as store:
        assert store.streams() == []
        with pytest.raises(StoreError, match="not installed"):
            store.head("public.t")
        store.install()
        store.install()  # idempotent
        assert store.streams() == []
