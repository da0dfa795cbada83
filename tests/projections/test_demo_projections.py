"""The demo shop's four projections over a real capture of the shop workload equal the same
views computed by SQL on the source."""

from __future__ import annotations

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import Capture, CaptureConfig, parse_lsn
from lakefold.demo import _shop
from lakefold.projections import (
    RedisCacheReader,
    Runner,
    RunnerConfig,
    SearchIndexReader,
    load_projections,
)
from lakefold.projections.operations import Catalog, SinkRoots

pytestmark = pytest.mark.timeout(300)


def test_demo_projections_equal_sql_on_the_source(pg, spark, redis_url, tmp_path):
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        _shop.create_schema(conn)
        conn.execute("ALTER TABLE shop.orders REPLICA IDENTITY FULL")
    config = CaptureConfig(source_dsn=pg.dsn, store_dsn=pg.dsn, slot="t_demo",
                           publication="t_demo", schema="shop")
    Capture(config).setup()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        _shop.run_workload(conn, _shop.Workload(customers=25, products=12, orders=300,
                                                batch=25))
        conn.execute("UPDATE shop.products SET price = price + 1 WHERE id <= 4")
        conn.execute("DELETE FROM shop.customers WHERE id = 25 AND NOT EXISTS "
                     "(SELECT 1 FROM shop.orders WHERE customer_id = 25)")
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
    Capture(config).run(until_lsn=parse_lsn(str(row[0])))

    with Runner(spark, load_projections("lakefold.demo.projections"),
                RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                             redis_url=redis_url, poll_seconds=0.2, trigger_seconds=0.1)
                ) as runner:
        runner.run(until_caught_up=True, timeout=240)

    catalog = Catalog(pg.dsn)
    with psycopg.connect(pg.dsn) as conn:
        expected = _shop.revenue_per_customer(conn)
        customers = conn.execute("SELECT id, name, email, city FROM shop.customers").fetchall()
        products = conn.execute("SELECT id, name, description, price FROM shop.products"
                                ).fetchall()
    revenue = DeltaTable(
        catalog.current("revenue_per_customer").location("delta")).to_pyarrow_table()
    assert sorted((r["customer_id"], r["name"], r["orders"], r["revenue"])
                  for r in revenue.to_pylist()) == expected

    with RedisCacheReader(redis_url) as cache:
        assert sorted(cache.keys("customer_cache")) == sorted(str(c[0]) for c in customers)
        for cid, name, email, city in customers:
            assert cache.get("customer_cache", cid) == {"id": str(cid), "name": name,
                                                        "email": email, "city": city}

    search = SearchIndexReader(lambda view: catalog.current(view).location("search"))
    assert search.count("product_search") == len(products)
    for pid, name, description, _price in products:
        document = search.get("product_search", pid) or {}
        assert (document.get("name"), document.get("description")) == (name, description)
    word = products[0][1].split()[0]
    assert {h.key for h in search.search("product_search", word, limit=100)} >= {
        str(p[0]) for p in products if word in p[1].split()}

    history = DeltaTable(catalog.current("price_history").location("delta")).to_pyarrow_table()
    rows = history.to_pylist()
    assert {r["id"]: r["price"] for r in rows if r["current"]} == {p[0]: p[3] for p in products}
    changed = [r for r in rows if r["id"] <= 4]
    assert all(sum(1 for r in changed if r["id"] == i) == 2 for i in range(1, 5))
    assert all(r["valid_to"] is not None for r in changed if not r["current"])
    catalog.close()
