"""The projection source over the event store: ranges, limits, metadata columns."""

from __future__ import annotations

import json

import pytest

from lakefold._bench.history import CATEGORY, load_history
from lakefold.eventstore import EventStore
from lakefold.projections.definitions._model import events
from lakefold.projections.plan._input_checks import event_categories, event_types
from lakefold.schemas.events import NewEvent
from lakefold.spark._source_reads import events_head
from lakefold.spark._source_records import source_frame
from tests.projections import helpers

pytestmark = pytest.mark.timeout(120)


def test_event_source_streams_every_event_once_in_small_batches(pg, spark, tmp_path):
    store = EventStore(pg.dsn)
    store.install()
    for i in range(25):
        store.append(f"order-{i % 5}", [NewEvent(type="OrderPlaced", data={"n": i})])
        store.append(f"cart-{i}", [NewEvent(type="CartOpened", data={"n": i})])
    store.close()
    assert events_head(pg.dsn) == 50
    assert event_categories(pg.dsn) == ["cart", "order"]
    assert event_types(pg.dsn, None) == ["CartOpened", "OrderPlaced"]
    frame = source_frame(spark, pg.dsn, events("order"), max_records=7)
    seen = []
    query = (frame.writeStream.foreachBatch(lambda df, i: seen.append((i, df.collect())))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(60)
    rows = [r for _, batch in seen for r in batch]
    assert sorted(json.loads(r["data"])["n"] for r in rows) == list(range(25))
    assert all(r["_type"] == "OrderPlaced" and r["_stream"].startswith("order-") for r in rows)
    assert [r["_position"] for r in rows] == sorted(r["_position"] for r in rows)
    assert not any(r["_deleted"] for r in rows)


def test_event_source_batches_hold_the_limit_from_the_first(pg, spark, tmp_path):
    load_history(pg.dsn, 30, per_stream=10, customers=3)
    frame = source_frame(spark, pg.dsn, events(CATEGORY), max_records=10)
    seen = helpers.stream_batches(frame, tmp_path / "ck", 30)
    # Position 0 holds no event: the first batch still gets ten (no one-event batch at the end).
    assert [len(batch) for batch in seen] == [10, 10, 10]
    assert [r["_position"] for batch in seen for r in batch] == list(range(1, 31))
