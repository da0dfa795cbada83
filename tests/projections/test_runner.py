"""The runner end to end on real PostgreSQL, the event store, Spark, Delta, Redis and
Tantivy: every target, dead letters, pause and resume."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefold.projections import (
    Catalog,
    DeadLetters,
    RedisCacheReader,
    Runner,
    RunnerConfig,
    SearchIndexReader,
    SinkRoots,
    load_projections,
)
from tests.projections import helpers

pytestmark = pytest.mark.timeout(240)
EVENTS_MODULE = str(Path(__file__).with_name("event_projections.py"))


def test_event_projections_equal_a_fresh_computation(pg, spark, redis_url, tmp_path):
    rng = random.Random(7)
    expected_revenue = helpers.append_orders(pg.dsn, rng, 60, poison_every=13)
    registry = load_projections(EVENTS_MODULE)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2)
    runner = Runner(spark, registry, config)
    runner.run(until_caught_up=True, timeout=180)

    catalog = Catalog(pg.dsn)
    revenue = DeltaTable(catalog.current("revenue").delta_path).to_pyarrow_table().to_pylist()
    assert {r["customer"]: r["revenue"] for r in revenue} == {
        k: v.quantize(Decimal("0.01")) for k, v in expected_revenue.items()}
    letters = DeadLetters(catalog).find("revenue")
    assert sorted(d.position for d in letters) == [13, 26, 39, 52]
    assert all("poison order" in d.error and d.attempts == 2 for d in letters)

    last, notes = helpers.orders_expected(pg.dsn)
    with RedisCacheReader(redis_url) as reader:
        assert sorted(reader.keys("last_order")) == sorted(last)
        for customer, row in last.items():
            assert reader.get("last_order", customer) == row

    search = SearchIndexReader(lambda view: catalog.current(view).index_dir)
    assert search.count("order_search") == len(notes)
    word = helpers.NOTE_WORDS[0]
    assert sorted(h.key for h in search.search("order_search", word, limit=100)) == sorted(
        order for order, note in notes.items() if word in note.split())
    catalog.close()
