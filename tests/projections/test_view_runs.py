"""Views under ``Runner.run``: a chain of views reaches its Delta and Redis targets and follows
the source; a view that fails is marked failed while the others carry on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.local import LocalRedis
from lakefold.projections import (
    DeadLetters,
    ProjectionNotFoundError,
    RedisCacheReader,
    Runner,
    RunnerConfig,
)
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table, redis_cache
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from tests.capture.conftest import capture_now, execute
from tests.projections.view_shop import ORDER_LINES, REVENUE_BY_CITY, oracle

pytestmark = pytest.mark.timeout(300)
SHOP = {"orders": changelog("public.orders"), "customers": changelog("public.customers"),
        "products": changelog("public.products")}


def _registry(*, broken: bool = False) -> Registry:
    registry = Registry()
    with registering_into(registry):
        view("order_lines", inputs=SHOP, key=["order_id"], query=ORDER_LINES,
             target=delta_table("upsert", keys=["order_id"]))
        view("revenue_by_city", inputs={"lines": "order_lines"}, key="city",
             query=REVENUE_BY_CITY, target=redis_cache("city"))
        if broken:  # customers' ids and orders' customers: not unique (a union, which the
            # plan cannot judge: its rows can)
            view("orders_by_customer", inputs={"orders": SHOP["orders"],
                                               "customers": SHOP["customers"]},
                 key="customer_id",
                 query="SELECT customer_id, id FROM orders UNION ALL "
                       "SELECT id AS customer_id, id FROM customers",
                 target=delta_table("upsert", keys=["customer_id"]))
            # order 2's amount is 2.50: a division by zero on that order's data only
            view("ratios", inputs={"orders": SHOP["orders"]}, key="order_id",
                 query="SELECT id AS order_id, 100 / (amount - 2.50) AS ratio FROM orders",
                 target=delta_table("upsert", keys=["order_id"]))
    return registry


def _check(dsn: str, catalog: Catalog, redis_url: str) -> None:
    lines = DeltaTable(catalog.current("order_lines").location("delta")).to_pyarrow_table()
    assert {row["order_id"]: row for row in lines.to_pylist()} == {
        k[0]: row for k, row in oracle(dsn, "order_lines").items()}
    expected = oracle(dsn, "revenue_by_city")
    with RedisCacheReader(redis_url) as reader:
        assert sorted(reader.keys("revenue_by_city")) == sorted(k[0] for k in expected)
        for (city,), row in expected.items():
            cached = reader.get("revenue_by_city", city)
            assert cached is not None and int(cached["orders"]) == row["orders"]


def test_a_chain_of_views_runs_to_its_targets_and_follows_the_source(
        spark: Any, shop: CaptureConfig, redis_url: str, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=redis_url,
                          poll_seconds=0.1)
    with Catalog(dsn) as catalog:
        with Runner(spark, _registry(), config) as runner:
            reports = {r.name: r for r in runner.run(until_caught_up=True, timeout=120)}
        _check(dsn, catalog, redis_url)
        assert catalog.projection("order_lines").state == "stopped"
        # the run's report (what `lakefold run` prints) has the views
        assert reports["order_lines"].caught_up and reports["order_lines"].batches >= 1
        assert reports["order_lines"].records == len(oracle(dsn, "order_lines"))
        assert reports["order_lines"].position == {"orders": 15, "customers": 6,
                                                   "products": 4}
        execute(dsn, "UPDATE customers SET city = 'Pune' WHERE id = 3",
                "DELETE FROM orders WHERE id = 5", "INSERT INTO orders VALUES (50, 1, 2, 9)")
        capture_now(shop)
        with Runner(spark, _registry(), config) as runner:  # a restart carries on
            runner.run(until_caught_up=True, timeout=120)
        _check(dsn, catalog, redis_url)


def _batches(dsn: str, name: str) -> list[tuple[int, dict[str, int], int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT batch_id, end_position, rows FROM lakefold.projection_batches "
                            "WHERE name = %s AND generation = 1 ORDER BY batch_id",
                            (name,)).fetchall()
    return [(int(b), dict(end), int(n)) for b, end, n in rows]


def test_a_view_notes_its_batches_in_the_catalog_as_a_projection_does(
        spark: Any, shop: CaptureConfig, redis_url: str, tmp_path: Path) -> None:
    """Status shows a view's throughput and last batch (from the catalog's batches); the
    batches go on numbering after a restart, and count the input records they applied."""
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=redis_url,
                          poll_seconds=0.1)
    with Catalog(dsn) as catalog:
        with Runner(spark, _registry(), config) as runner:
            runner.run(until_caught_up=True, timeout=120)
        statuses = {s.name: s for s in projection_status(catalog, dsn)}
        for name in ("order_lines", "revenue_by_city"):
            assert statuses[name].style == "view"
            assert statuses[name].throughput_per_s > 0, name
            assert statuses[name].last_batch_at is not None, name
        first = _batches(dsn, "order_lines")
        assert [b for b, _, _ in first] == list(range(len(first)))
        applied = {"orders": 16, "customers": 7, "products": 5}  # first positions not applied
        assert first[-1][1] == applied and sum(n for _, _, n in first) == 15 + 6 + 4
        live = catalog.current("order_lines")
        assert (live.position, live.batch_id, live.rows_total) == (applied, len(first) - 1, 25)
        (upstream,) = statuses["revenue_by_city"].sources
        assert catalog.current("revenue_by_city").rows_total == upstream.head

        execute(dsn, "UPDATE customers SET city = 'Pune' WHERE id = 3",
                "DELETE FROM orders WHERE id = 5", "INSERT INTO orders VALUES (50, 1, 2, 9)")
        capture_now(shop)
        with Runner(spark, _registry(), config) as runner:  # a restart numbers on
            runner.run(until_caught_up=True, timeout=120)
        batches = _batches(dsn, "order_lines")
        assert batches[:len(first)] == first and len(batches) > len(first)
        assert [b for b, _, _ in batches] == list(range(len(batches)))
        live = catalog.current("order_lines")
        assert live.position == {"orders": 18, "customers": 8, "products": 5}
        assert live.rows_total == 25 + 3 and live.batch_id == len(batches) - 1


def test_a_failing_view_stops_alone(spark: Any, shop: CaptureConfig, redis_url: str,
                                    tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=redis_url,
                          poll_seconds=0.1)
    with Runner(spark, _registry(broken=True), config) as runner, Catalog(dsn) as catalog:
        runner.run(until_caught_up=True, timeout=120)
        failed = catalog.projection("orders_by_customer")
        assert failed.state == "failed"
        assert failed.last_error is not None and "two output rows have the key" in \
            failed.last_error
        _check(dsn, catalog, redis_url)
        # A failure on one partition's data: that partition is dead-lettered, the rest written.
        assert catalog.projection("ratios").state == "stopped"
        letters = DeadLetters(catalog).find("ratios")
        assert [(d.stage, d.record) for d in letters] == [("view", {"partition":
                                                                    {"order_id": "2"}})]
        assert "DIVIDE_BY_ZERO" in letters[0].error
        # said once, by lakefold: not again by pyspark's log with a JVM stack trace
        assert not [r for r in caplog.records if r.name.endswith("QueryContextLogger")]
        ratios = DeltaTable(catalog.current("ratios").location("delta")).to_pyarrow_table()
        assert sorted(ratios.column("order_id").to_pylist()) == [
            i for i in range(1, 16) if i != 2]


def test_a_schema_change_that_breaks_a_view_stops_it_alone_naming_column_and_ddl(
        spark: Any, shop: CaptureConfig, redis_url: str, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=redis_url,
                          poll_seconds=0.1)

    def registry() -> Registry:
        views = _registry()
        with registering_into(views):
            view("cities", inputs={"customers": SHOP["customers"]}, key="city",
                 query="SELECT city, count(*) AS customers FROM customers GROUP BY city",
                 target=delta_table("upsert", keys=["city"]))
        return views

    with Runner(spark, registry(), config) as runner:
        runner.run(until_caught_up=True, timeout=120)
    execute(dsn, "ALTER TABLE orders RENAME COLUMN amount TO total",
            "UPDATE orders SET total = total + 1 WHERE id = 1",
            "UPDATE customers SET city = 'Pune' WHERE id = 2")
    capture_now(shop)
    with Runner(spark, registry(), config) as runner, Catalog(dsn) as catalog:
        reports = {r.name: r for r in runner.run(until_caught_up=True, timeout=120)}
        broken = catalog.projection("order_lines")
        assert broken.state == "failed" and reports["order_lines"].state == "failed"
        error = str(broken.last_error)
        assert "amount" in error and "no longer fits" in error
        assert "orders (public.orders, schema version 2 since position" in error
        assert "source LSN" in error and "total" in error
        # every other view goes on: the one over customers follows the move
        assert reports["cities"].state == "stopped"
        cities = DeltaTable(catalog.current("cities").location("delta")).to_pyarrow_table()
        with psycopg.connect(dsn) as conn:
            expected: dict[str, int] = dict(conn.execute(
                "SELECT city, count(*) FROM customers GROUP BY city").fetchall())
        assert dict(zip(cities.column("city").to_pylist(),
                        cities.column("customers").to_pylist(), strict=True)) == expected


def test_a_view_whose_target_is_down_retries_with_backoff_and_runs_again(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    """Its Redis down, a view says ``retrying`` with the error and tries again with backoff
    (1 s, 2 s, …: a handful of errors in seconds, not one per look); once Redis is back it
    catches up and says ``running`` again."""
    dsn = shop.source_dsn
    server = LocalRedis().start()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=server.url,
                          poll_seconds=0.05)
    stop = threading.Event()
    with Catalog(dsn) as catalog, Runner(spark, _registry(), config) as runner:
        thread = threading.Thread(target=runner.run, kwargs={"stop": stop})
        thread.start()
        try:
            def state(name: str) -> str:
                try:
                    return next(s.state for s in projection_status(catalog, dsn, [name]))
                except (ProjectionNotFoundError, StopIteration):  # not registered yet
                    return ""

            _wait(lambda: state("revenue_by_city") == "running"
                  and catalog.current("revenue_by_city").batch_id is not None, "a first batch")
            server.stop()
            before = catalog.projection("revenue_by_city").errors_total
            execute(dsn, "UPDATE customers SET city = 'Oulu' WHERE id = 2")
            capture_now(shop)
            _wait(lambda: state("revenue_by_city") == "retrying", "the view to retry")
            time.sleep(4)
            row = catalog.projection("revenue_by_city")
            assert row.state == "retrying" and f"127.0.0.1:{server.port}" in (row.last_error or "")
            # 0.05 s looks for 4 s: ~80 tries without backoff; with it 1 + 2 + 4 s: ≤ 4
            assert 1 <= row.errors_total - before <= 4, row.errors_total - before
            server = LocalRedis(port=server.port).start()
            _wait(lambda: state("revenue_by_city") == "running", "the view to run again",
                  timeout=60)
        finally:
            stop.set()
            thread.join()
            server.stop()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), redis_url=server.url)
    server = LocalRedis(port=server.port).start()
    try:
        with Catalog(dsn) as catalog, Runner(spark, _registry(), config) as runner:
            runner.run(until_caught_up=True, timeout=120)
            with RedisCacheReader(server.url) as reader:
                assert reader.get("revenue_by_city", "Oulu") is not None
    finally:
        server.stop()


def _wait(check: Any, what: str, *, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
