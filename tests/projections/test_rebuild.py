"""Rebuild while writes continue: the new generation equals a fresh computation, and a reader
polling throughout never sees an empty, partial or older view."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefold.eventstore import EventStore
from lakefold.projections import RedisCacheReader, Runner, RunnerConfig, load_projections
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.targets import _delta
from lakefold.schemas.events import NewEvent
from lakefold.spark._source_reads import events_head
from tests.projections import helpers

pytestmark = pytest.mark.timeout(240)
EVENTS_MODULE = str(Path(__file__).with_name("event_projections.py"))
CUSTOMERS = [f"c{i}" for i in range(7)]


def revenue_of(dsn: str) -> dict[str, Decimal]:
    with Catalog(dsn) as catalog:
        path = catalog.current("revenue").location("delta")
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return {r["customer"]: r["revenue"] for r in rows}


def test_rebuild_while_writing_switches_without_a_gap(pg, spark, redis_url, tmp_path,
                                                      monkeypatch):
    # Batches above this many input records take the large-batch path (computed once, merged
    # from the driver when the output is small), as a rebuild's million-record batches do.
    monkeypatch.setattr(_delta, "DRIVER_MERGE_ROWS", 10)
    rng = random.Random(3)
    store = EventStore(pg.dsn)
    store.install()
    expected: dict[str, Decimal] = {}
    lock = threading.Lock()

    def append(count: int) -> None:
        for _ in range(count):
            customer = rng.choice(CUSTOMERS)
            amount = Decimal(rng.randrange(100, 5_000)) / 100
            store.append(f"order-{rng.randrange(10**9)}", [NewEvent(type="OrderPlaced", data={
                "customer": customer, "amount": str(amount), "note": "x"})])
            with lock:
                expected[customer] = expected.get(customer, Decimal(0)) + amount

    for customer in CUSTOMERS:  # every customer exists before readers start
        store.append(f"order-first-{customer}", [NewEvent(type="OrderPlaced", data={
            "customer": customer, "amount": "1.00", "note": "x"})])
        expected[customer] = Decimal("1.00")
    append(60)
    registry = load_projections(EVENTS_MODULE)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2,
                          only=("revenue", "last_order"))
    with Runner(spark, registry, config) as runner, Catalog(pg.dsn) as catalog:
        t0 = time.monotonic()
        runner.run(until_caught_up=True, timeout=120)
        print("initial catch-up", time.monotonic() - t0)

        stop = threading.Event()
        problems: list[str] = []
        reads = {"redis": 0, "delta": 0}

        def read() -> None:
            last_revenue: dict[str, Decimal] = {}
            last_position: dict[str, int] = {}
            with RedisCacheReader(redis_url, pointer_ttl=0) as reader:
                while not stop.is_set():
                    keys = reader.keys("last_order")
                    if sorted(keys) != CUSTOMERS:
                        problems.append(f"redis view has keys {keys}")
                    for customer in CUSTOMERS:
                        position = reader.position("last_order", customer) or 0
                        if position < last_position.get(customer, 0):
                            problems.append(f"redis {customer} went back to {position}")
                        last_position[customer] = position
                    reads["redis"] += 1
                    try:
                        revenue = revenue_of(pg.dsn)
                    except OSError as e:  # a retired generation deleted under our feet
                        problems.append(f"delta read failed: {e}")
                        continue
                    if sorted(revenue) != CUSTOMERS:
                        problems.append(f"delta view has customers {sorted(revenue)}")
                    for customer, value in revenue.items():
                        if value < last_revenue.get(customer, Decimal(0)):
                            problems.append(f"delta {customer} went back to {value}")
                        last_revenue[customer] = value
                    reads["delta"] += 1

        def write() -> None:
            while not stop.is_set():
                append(2)
                time.sleep(0.1)

        threads = [threading.Thread(target=read), threading.Thread(target=write)]
        run_stop = threading.Event()
        runner_thread = threading.Thread(target=runner.run, kwargs={"stop": run_stop})
        runner_thread.start()
        for thread in threads:
            thread.start()
        time.sleep(1)
        runner.request_rebuild("revenue")
        runner.request_rebuild("last_order")
        deadline = time.monotonic() + 150
        while (catalog.current("revenue").generation, catalog.current("last_order").generation) \
                != (2, 2):
            assert time.monotonic() < deadline, "the rebuild did not switch in time"
            time.sleep(0.3)
        print("switched", time.monotonic() - t0)
        time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join()
        head = events_head(pg.dsn)
        while not all(catalog.current(n).position.get("order", 0) > head
                      for n in ("revenue", "last_order")):
            assert time.monotonic() < deadline, "the new generation did not catch up"
            time.sleep(0.3)
        print("caught up", time.monotonic() - t0)
        run_stop.set()
        runner_thread.join()
        print("stopped", time.monotonic() - t0)
        store.close()

        assert problems == []
        assert reads["redis"] > 5 and reads["delta"] > 5
        assert revenue_of(pg.dsn) == expected
        last, _ = helpers.orders_expected(pg.dsn)
        with RedisCacheReader(redis_url) as reader:
            assert {c: reader.get("last_order", c) for c in CUSTOMERS} == last
        generations = {(g.generation, g.status) for g in catalog.generations("revenue")}
        assert generations == {(1, "retired"), (2, "live")}
