"""The Spark sources over the event store and the changelog: batch, streaming, typed columns."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from lakefold.eventstore import EventStore, StoreOptions
from lakefold.schemas import NewEvent
from lakefold.schemas.arrow import conform_batch
from lakefold.spark import SparkLayerError
from lakefold.spark._source_positions import (
    PositionRange,
    ReadOptions,
    capped_end,
    limit_rows,
    split_range,
)
from lakefold.spark._source_registry import register_sources
from tests.spark import events_fixture as shop

pytestmark = pytest.mark.timeout(180)
REGISTRY = "tests.spark.events_fixture:registry"


def test_split_range_covers_the_range_without_overlap():
    options = ReadOptions(partition_size=10, max_partitions=4)
    assert split_range(5, 5, options) == []
    assert split_range(1, 8, options) == [PositionRange(1, 8)]
    parts = split_range(1, 101, options)
    assert len(parts) == 4 and parts[0].start == 1 and parts[-1].end == 101
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    with pytest.raises(SparkLayerError, match="maxRecordsPerTrigger"):
        ReadOptions.parse({"maxRecordsPerTrigger": "lots"})
    with pytest.raises(SparkLayerError, match="at least 1"):
        ReadOptions.parse({"startingPosition": "0"})


def test_both_source_families_cap_a_batch_alike():
    assert capped_end(1, 100, None) == 101
    assert capped_end(1, 100, 10) == 11
    assert capped_end(0, 100, 10) == 11  # position 0 holds no record: not counted
    assert capped_end(50, 20, 10) == 50  # behind nothing: an empty batch
    assert limit_rows(ReadMaxRows(7)) == 7
    assert limit_rows(ReadAllAvailable()) is None


def test_conform_fills_what_a_reader_did_not_fetch():
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False),
                        pa.field("b", pa.string(), nullable=False),
                        pa.field("c", pa.bool_(), nullable=False),
                        pa.field("d", pa.float64()), pa.field("e", pa.int32())])
    batch = pa.RecordBatch.from_pydict({"e": pa.array([1, None], pa.int64()), "x": [1, 2]})
    conformed = conform_batch(batch, schema)
    assert conformed.schema == schema
    assert conformed.to_pydict() == {"a": [0, 0], "b": ["", ""], "c": [False, False],
                                     "d": [None, None], "e": [1, None]}


@pytest.fixture
def store(pg):
    with EventStore(pg.dsn, registry=shop.registry) as events:
        events.install()
        for i in range(6):
            events.append(f"order-{i}", [
                shop.OrderPlaced(order_id=str(i), amount_cents=100 * i, tags=["x"],
                                 extra={"k": i},
                                 at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
                shop.OrderPaid(order_id=str(i), paid=Decimal("1.25")),
            ])
        events.append("cart-1", [shop.OrderPaid(order_id="c", paid=Decimal(2))])
    # An event stored at version 1 of order.placed, before the model changed.
    with EventStore(pg.dsn) as raw:
        raw.append("order-old", [NewEvent(type="order.placed", schema_version=1,
                                          data={"order_id": "old", "amount": 1.5})])
    # Positions 1-12 sealed into segments (shredded payloads), 13-14 read as rows.
    with EventStore(pg.dsn, options=StoreOptions(segment_positions=4)) as sealer:
        assert sealer.seal().segments == 3
    return pg.dsn


def test_events_batch_read_all_category_and_types(spark, store):
    register_sources(spark)
    reader = spark.read.format("lakefold_events").option("dsn", store)
    all_events = reader.load()
    assert all_events.count() == 14
    positions = [r.position for r in all_events.orderBy("position").collect()]
    assert positions == list(range(1, 15))
    orders = reader.option("category", "order").option("partitionSize", "3").load()
    assert orders.count() == 13
    assert orders.rdd.getNumPartitions() > 1
    paid = spark.read.format("lakefold_events").option("dsn", store) \
        .option("types", "order.paid").load()
    assert {r.type for r in paid.collect()} == {"order.paid"} and paid.count() == 7
    ranged = spark.read.format("lakefold_events").option("dsn", store) \
        .option("startingPosition", "3").option("endingPosition", "5").load()
    assert [r.position for r in ranged.orderBy("position").collect()] == [3, 4]


def test_events_typed_payloads_with_upcasting(spark, store):
    register_sources(spark)
    frame = (spark.read.format("lakefold_events").option("dsn", store)
             .option("registry", REGISTRY).option("types", "order.placed").load())
    fields = {f.name: f.dataType.simpleString() for f in frame.schema["data"].dataType.fields}
    assert fields == {"order_id": "string", "amount_cents": "bigint", "at": "timestamp",
                      "tags": "array<string>", "extra": "string"}
    rows = {r["order_id"]: r for r in frame.select("data.*").collect()}
    assert rows["old"]["amount_cents"] == 150  # upcast from version 1
    assert rows["3"]["amount_cents"] == 300 and rows["3"]["tags"] == ["x"]
    assert rows["3"]["extra"] == '{"k":3}'
    assert rows["3"]["at"] == dt.datetime(2024, 1, 1)
    both = (spark.read.format("lakefold_events").option("dsn", store)
            .option("registry", REGISTRY).load())
    paid = both.filter("type = 'order.paid'").select("data.paid").first()
    assert paid is not None and paid[0] == Decimal("1.25")
    narrow = (spark.read.format("lakefold_events").option("dsn", store)
              .option("registry", REGISTRY).option("columns", "position, data").load())
    assert narrow.columns == ["position", "data"]
    by_position = {r["position"]: r["data"]["amount_cents"] for r in narrow.collect()}
    assert by_position[1] == 0 and by_position[3] == 100 and by_position[2] is None
    fields = (spark.read.format("lakefold_events").option("dsn", store)
              .option("registry", REGISTRY)
              .option("columns", "position,data.amount_cents,data.order_id").load())
    assert fields.schema["data"].dataType.simpleString() == \
        "struct<order_id:string,amount_cents:bigint>"
    cents = {r["position"]: r["data"]["amount_cents"] for r in fields.collect()}
    assert cents == by_position
    with pytest.raises(Exception, match="name payload fields, which need typed payloads"):
        spark.read.format("lakefold_events").option("dsn", store) \
            .option("columns", "position,data.amount_cents").load()
    with pytest.raises(Exception, match=r"no selected event type has payload field\(s\) nope"):
        spark.read.format("lakefold_events").option("dsn", store).option("registry", REGISTRY) \
            .option("columns", "data.nope").load()
    with pytest.raises(Exception, match="unknown event column"):
        spark.read.format("lakefold_events").option("dsn", store) \
            .option("columns", "position,nope").load().count()


def test_events_stream_honours_max_records_per_trigger(spark, store, tmp_path):
    register_sources(spark)
    stream = (spark.readStream.format("lakefold_events").option("dsn", store)
              .option("maxRecordsPerTrigger", "4").load())
    sizes: list[int] = []

    def collect(frame, batch_id):
        sizes.append(frame.count())

    query = (stream.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="10 milliseconds").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sum(sizes) == 14
    assert max(sizes) == 4 and [s for s in sizes if s] == [4, 4, 4, 2]


def test_bad_source_options(spark, pg):
    register_sources(spark)
    with pytest.raises(Exception, match=r"needs \.option\('stream'"):
        spark.read.format("lakefold_changelog").option("dsn", pg.dsn).load().count()
    with pytest.raises(Exception, match="registry 'nope' is not an import path"):
        spark.read.format("lakefold_events").option("dsn", pg.dsn) \
            .option("registry", "nope").load().count()


@pytest.fixture
def captured(pg):
    """A captured table with inserts, updates and deletes, and its changelog stream."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, name text, price numeric(10,2), "
            "at timestamptz, tags text[], t time)").format(sql.Identifier("items")))
    capture = Capture(CaptureConfig(source_dsn=pg.dsn, slot="spark_t", publication="spark_t",
                                    tables=("public.items",)))
    capture.setup()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        with conn.transaction():
            for i in range(1, 21):
                conn.execute(
                    "INSERT INTO items VALUES (%s, %s, %s, %s, %s, '12:30:00')",
                    (i, f"item {i}", Decimal(i) / 4, dt.datetime(2024, 1, i, tzinfo=dt.UTC),
                     ["a", "b"]))
        conn.execute("UPDATE items SET name = 'renamed' WHERE id = 3")
        conn.execute("DELETE FROM items WHERE id = 4")
    # Capture as in production: running until stopped; stop once the stream's head (what
    # readers may see) covers the workload.
    stop = threading.Event()
    runner = threading.Thread(target=capture.run, kwargs={"stop": stop}, daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    try:
        with ChangelogStore(pg.dsn) as store:
            while store.head("public.items") < 22:
                assert time.monotonic() < deadline, "the capture did not publish its records"
                time.sleep(0.05)
    finally:
        stop.set()
        runner.join(timeout=30)
    return pg.dsn


def test_changelog_source_typed_columns_batch_and_stream(spark, captured, tmp_path: Path):
    register_sources(spark)
    frame = (spark.read.format("lakefold_changelog").option("dsn", captured)
             .option("stream", "public.items").load())
    types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    assert types["id"] == "int" and types["price"] == "decimal(10,2)"
    assert types["at"] == "timestamp" and types["tags"] == "array<string>"
    assert types["t"] == "string" and types["_op"] == "string"
    rows = frame.orderBy("_position").collect()
    assert len(rows) == 22
    assert [r["_op"] for r in rows[-2:]] == ["update", "delete"]
    assert rows[0]["price"] == Decimal("0.25") and rows[0]["tags"] == ["a", "b"]
    assert rows[-2]["name"] == "renamed" and rows[-1]["id"] == 4

    stream = (spark.readStream.format("lakefold_changelog").option("dsn", captured)
              .option("stream", "public.items").option("maxRecordsPerTrigger", "10").load())
    seen: list[int] = []

    def collect(batch, batch_id):
        seen.extend(r["_position"] for r in batch.collect())

    query = (stream.writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    query.awaitTermination(120)
    assert sorted(seen) == [r["_position"] for r in rows]




def test_every_format_starts_with_the_record_metadata_columns(spark, store, captured):
    """One vocabulary: the public formats hand out the record metadata columns that
    projections read (``_source_columns``), before the store's own columns."""
    register_sources(spark)
    meta = ["_position", "_ts", "_type", "_stream", "_deleted"]
    events = spark.read.format("lakefold_events").option("dsn", store).load()
    assert events.columns[:5] == meta and events.columns[5] == "position"
    rows = events.orderBy("position").collect()
    assert all(r["_position"] == r["position"] and r["_type"] == r["type"]
               and r["_stream"] == r["stream_id"] and r["_ts"] == r["recorded_at"]
               and r["_deleted"] is False for r in rows)
    picked = (spark.read.format("lakefold_events").option("dsn", store)
              .option("columns", "_position,_type,stream_id").load())
    assert picked.columns == ["_position", "_type", "stream_id"]
    assert picked.orderBy("_position").first()["_type"] == rows[0]["type"]
    only_meta = (spark.read.format("lakefold_events").option("dsn", store)
                 .option("columns", "_stream").load())
    assert only_meta.columns == ["_stream"] and only_meta.count() == len(rows)
    changes = (spark.read.format("lakefold_changelog").option("dsn", captured)
               .option("stream", "public.items").load())
    assert changes.columns[:6] == [*meta, "_op"]
    last = changes.orderBy("_position").collect()[-2:]
    assert [(r["_type"], r["_deleted"], r["_stream"]) for r in last] == \
        [("update", False, "public.items"), ("delete", True, "public.items")]
