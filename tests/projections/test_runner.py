"""The runner end to end on real PostgreSQL, the event store, Spark, Delta, Redis and
Tantivy: every target, dead letters, pause and resume."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable

from lakefold.projections import (
    DeadLetters,
    ProjectionNotFoundError,
    ProjectionStateError,
    RedisCacheReader,
    Runner,
    RunnerConfig,
    SearchIndexReader,
    load_projections,
)
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.targets._search import IndexLayout, SearchIndexWriter
from tests.projections import helpers

pytestmark = pytest.mark.timeout(240)
EVENTS_MODULE = str(Path(__file__).with_name("event_projections.py"))


def test_event_projections_equal_a_fresh_computation(pg, spark, redis_url, tmp_path):
    rng = random.Random(7)
    expected_revenue = helpers.append_orders(pg.dsn, rng, 60, poison_every=13)
    registry = load_projections(EVENTS_MODULE)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2)
    with Runner(spark, registry, config) as runner, Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=180)
        revenue = DeltaTable(catalog.current("revenue").location("delta")).to_pyarrow_table(
            ).to_pylist()
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

        search = SearchIndexReader(lambda view: catalog.current(view).location("search"))
        assert search.count("order_search") == len(notes)
        word = helpers.NOTE_WORDS[0]
        assert sorted(h.key for h in search.search("order_search", word, limit=100)) == sorted(
            order for order, note in notes.items() if word in note.split())

        # targeted rebuild: damage some keys, repair a key range and one stream in place
        client = redis.Redis.from_url(redis_url)
        prefix = catalog.current("last_order").location("redis")
        client.hset(prefix + "k:c1", "amount", "bogus")
        client.delete(prefix + "k:c2")
        client.hset(prefix + "k:c1x", "customer", "c1x")  # a stale key inside the range
        client.hset(prefix + "k:c5", "amount", "bogus")  # outside the range: left alone
        report = runner.rebuild_part("last_order", key_from="c1", key_to="c3")
        assert report.deleted == 1 and report.generation == 1
        with RedisCacheReader(redis_url) as reader:
            assert reader.get("last_order", "c1") == last["c1"]
            assert reader.get("last_order", "c2") == last["c2"]
            assert reader.get("last_order", "c1x") is None
            assert (reader.get("last_order", "c5") or {}).get("amount") == "bogus"
        client.close()
        damaged = sorted(notes)[3]
        index_writer = SearchIndexWriter(catalog.current("order_search").location("search"),
                                         IndexLayout(key="order", text=("note",), fields=()))
        index_writer.write(pa.Table.from_pylist([{"order": damaged, "_deleted": True}]),
                           batch_id=index_writer.checkpoint or 0, repair=True)
        index_writer.close()
        assert search.get("order_search", damaged) is None
        runner.rebuild_part("order_search", stream=damaged)
        assert (search.get("order_search", damaged) or {}).get("note") == notes[damaged]
        with pytest.raises(ProjectionStateError, match="is a fold"):
            runner.rebuild_part("revenue", key_from="c1")
        assert not catalog.projection("last_order").paused


def wait_until(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_pause_resume_and_dead_letter_retry(pg, spark, redis_url, tmp_path):
    rng = random.Random(5)
    antidote = tmp_path / "fixed"
    poisoned: dict[str, Decimal] = {}
    expected = helpers.append_orders(pg.dsn, rng, 30, poison_every=10, antidote=str(antidote),
                                     poisoned=poisoned)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2,
                          only=("revenue", "last_order"))
    runner = Runner(spark, load_projections(EVENTS_MODULE), config)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop})
    thread.start()
    catalog = Catalog(pg.dsn)
    dead = DeadLetters(catalog)
    try:
        def revenue() -> dict[str, Decimal]:
            try:
                path = catalog.current("revenue").location("delta")
            except ProjectionNotFoundError:  # the runner has not installed the catalog yet
                return {}
            if not Path(path, "_delta_log").exists():
                return {}
            return {r["customer"]: r["revenue"]
                    for r in DeltaTable(path).to_pyarrow_table().to_pylist()}

        wait_until(lambda: revenue() == expected and len(dead.find("revenue")) == 3,
                   what="the first catch-up")
        # pause: the runner stops the query; new events do not reach the paused view
        catalog.set_paused("last_order", True)
        wait_until(lambda: not any(k[0] == "last_order" for k in runner.queries),
                   what="the pause")
        reader = RedisCacheReader(redis_url)
        frozen = {c: reader.get("last_order", c) for c in reader.keys("last_order")}
        more = helpers.append_orders(pg.dsn, rng, 10, first=30)
        for customer, amount in more.items():
            expected[customer] = expected.get(customer, Decimal(0)) + amount
        wait_until(lambda: revenue() == expected, what="the unpaused projection")
        assert {c: reader.get("last_order", c) for c in reader.keys("last_order")} == frozen
        assert catalog.projection("last_order").state == "paused"
        # the poison is fixed: retrying the dead letters folds them in, exactly once
        antidote.touch()
        dead.request_retry([d.id for d in dead.find("revenue")])
        for customer, amount in poisoned.items():
            expected[customer] = expected.get(customer, Decimal(0)) + amount
        wait_until(lambda: revenue() == expected, what="the retried dead letters")
        assert {d.status for d in dead.find("revenue")} == {"resolved"}
        # resume: the view catches up from where it stopped
        catalog.set_paused("last_order", False)
        last, _ = helpers.orders_expected(pg.dsn)
        wait_until(lambda: {c: reader.get("last_order", c) for c in last} == last,
                   what="the resumed projection")
        reader.close()
    finally:
        stop.set()
        thread.join()
        runner.close()
        catalog.close()
