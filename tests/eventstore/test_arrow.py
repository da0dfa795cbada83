"""read_events_range: position ranges as Arrow batches, from plain arguments (Spark workers);
the same read as one SELECT for bulk consumers; what the store holds."""

from __future__ import annotations

import functools
import json
import pickle
import uuid
from collections.abc import Iterable

import psycopg
import pyarrow as pa
import pytest

from lakefold.eventstore import (
    EventStore,
    EventStoreNotInstalledError,
    EventStoreUnavailableError,
    InvalidRequestError,
    list_categories,
    list_event_types,
)
from lakefold.eventstore.arrow import (
    EVENTS_ARROW_SCHEMA,
    events_range_select,
    head_position,
    read_events_range,
)
from lakefold.schemas import EventMetadata, NewEvent
from tests.fixtures.postgres import TestDatabase


@pytest.fixture
def filled(pg: TestDatabase) -> str:
    with EventStore(pg.dsn) as store:
        store.install()
        correlation = uuid.uuid4()
        for i in range(10):
            store.append(f"order-{i % 3}", [NewEvent("order.placed", {"i": i, "name": "ünï"},
                         metadata=EventMetadata(correlation_id=correlation,
                                                extra={"by": "test"}))])
            store.append(f"invoice-{i}", [NewEvent("invoice.sent", {"i": i})])
        store.delete_stream("order-2")  # hides 3 events, adds a deletion record
        store.head()
    return pg.dsn


def _table(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=EVENTS_ARROW_SCHEMA)


def test_ranges_match_read_all(filled: str) -> None:
    head = head_position(filled)
    assert head == 21
    table = _table(read_events_range(filled, 1, head + 1, batch_size=4))
    with EventStore(filled) as store:
        expected = store.read_all(0, 100)
    assert table.column("position").to_pylist() == [e.position for e in expected]
    assert table.column("event_id").to_pylist() == [str(e.event_id) for e in expected]
    assert table.column("stream_version").to_pylist() == [e.stream_version for e in expected]
    assert [json.loads(d) for d in table.column("data").to_pylist()] == [e.data for e in expected]
    assert table.column("recorded_at").to_pylist() == [e.recorded_at for e in expected]
    first = table.slice(0, 1).to_pylist()[0]
    assert first["category"] == "order" and first["type"] == "order.placed"
    assert json.loads(first["metadata"]) == {"by": "test"} and first["correlation_id"]
    assert first["causation_id"] is None and first["schema_version"] == 1


def test_half_open_ranges_and_filters(filled: str) -> None:
    assert _table(read_events_range(filled, 2, 5)).column("position").to_pylist() == [2, 3, 4]
    assert _table(read_events_range(filled, 0, 3)).column("position").to_pylist() == [1, 2]
    # order-2's events (positions 5, 11, 17) are hidden by its soft delete: holes
    assert _table(read_events_range(filled, 4, 7)).column("position").to_pylist() == [4, 6]
    assert list(read_events_range(filled, 5, 5)) == []
    assert list(read_events_range(filled, 100, 200)) == []
    orders = _table(read_events_range(filled, 1, 100, category="order"))
    assert set(orders.column("stream_id").to_pylist()) == {"order-0", "order-1", "order-2"}
    assert orders.column("type").to_pylist().count("$stream.deleted") == 1
    hidden = _table(read_events_range(filled, 1, 100, category="order", include_deleted=True))
    assert hidden.num_rows == orders.num_rows + 3
    invoices = _table(read_events_range(filled, 1, 100, types=["invoice.sent"]))
    assert set(invoices.column("type").to_pylist()) == {"invoice.sent", "$stream.deleted"}
    for bad in ({"start": -1, "end": 3}, {"start": 1, "end": "x"}):
        with pytest.raises(InvalidRequestError):
            list(read_events_range(filled, **bad))
    with pytest.raises(InvalidRequestError):
        list(read_events_range(filled, 1, 3, category="order-1"))


def test_is_picklable_and_runs_in_spark_workers(filled: str, spark) -> None:
    job = pickle.loads(pickle.dumps(functools.partial(read_events_range, filled, 1, 11)))  # noqa: S301
    assert sum(b.num_rows for b in job()) == 9  # positions 1..10 minus order-2's hidden one

    def count(bounds: tuple[int, int]) -> list[int]:
        return [b.num_rows for b in read_events_range(filled, *bounds)]

    ranges = [(1, 8), (8, 15), (15, 22)]
    rows = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(count).sum()
    assert rows == _table(read_events_range(filled, 1, 22)).num_rows == 18


def test_range_select_reads_what_read_events_range_reads(filled: str) -> None:
    with psycopg.connect(filled, autocommit=True) as conn:
        for start, end, category, types in ((1, 22, None, None), (3, 17, "order", None),
                                            (1, 22, None, ["invoice.sent"]),
                                            (2, 20, "order", ["order.placed"])):
            cursor = conn.execute(events_range_select(conn, start, end, category=category,
                                                      types=types))
            assert [d.name for d in cursor.description or ()] == EVENTS_ARROW_SCHEMA.names
            rows = cursor.fetchall()
            expected = _table(read_events_range(filled, start, end, category=category,
                                                types=types))
            assert [r[0] for r in rows] == expected.column("position").to_pylist()
            assert [r[1] for r in rows] == expected.column("event_id").to_pylist()
    # deletion records pass a type filter: asking for them too returns them once
    with psycopg.connect(filled, autocommit=True) as conn:
        rows = conn.execute(events_range_select(
            conn, 1, 22, types=["$stream.deleted", "order.placed"])).fetchall()
    assert [r[5] for r in rows].count("$stream.deleted") == 1


def test_lists_categories_and_types(filled: str, pg: TestDatabase) -> None:
    assert list_categories(filled) == ["invoice", "order"]
    assert list_event_types(filled) == ["$stream.deleted", "invoice.sent", "order.placed"]
    assert list_event_types(filled, "invoice") == ["invoice.sent"]
    assert list_event_types(filled, "nothing") == []
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA lakefold CASCADE")
    assert list_categories(pg.dsn) == [] and list_event_types(pg.dsn) == []


def test_bulk_read_errors_say_what_is_wrong_without_the_password(pg: TestDatabase) -> None:
    with pytest.raises(EventStoreNotInstalledError, match=r"not installed.*events install"):
        list(read_events_range(pg.dsn, 1, 10))  # a database without the event store
    with pytest.raises(EventStoreUnavailableError, match="event store") as caught:
        list(read_events_range("host=127.0.0.1 port=1 user=x password=s3cret dbname=y", 1, 10))
    assert "s3cret" not in str(caught.value)
    with pytest.raises(InvalidRequestError, match=r"unknown event column.*nope"):
        list(read_events_range(pg.dsn, 1, 10, columns=["position", "nope"]))


def test_bulk_reads_reuse_their_connections_and_survive_their_loss(filled: str) -> None:
    from lakefold.eventstore import _readers

    _readers.close_idle()
    assert _table(read_events_range(filled, 1, 22)).num_rows == 18
    with psycopg.connect(filled, autocommit=True) as conn:
        pids = {r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")}
        assert len(pids) == 2  # the idle pair kept for the next read
        assert _table(read_events_range(filled, 1, 22)).num_rows == 18
        again = {r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")}
        assert again == pids  # reused
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    assert _table(read_events_range(filled, 1, 22)).num_rows == 18  # dead pair replaced
    _readers.close_idle()
