"""A captured TRUNCATE reaches every target (issue 18, item 5).

End to end through capture, the runner and every target (Delta upsert, SCD2 and append,
Redis, search, a single-source fold and a two-source fold), with the changes before a
truncate, the truncate and the changes after it in one micro-batch, then a rebuild; through
``lakefold.capture.recover`` after rows were deleted during an outage; and a runner SIGKILLed
while it applies truncates (replayed batches). The views are compared with SQL on the source.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import ChangelogStore, recover
from lakefold.projections import (
    DeadLetters,
    RedisCacheReader,
    Runner,
    RunnerConfig,
    SearchIndexReader,
    load_projections,
)
from lakefold.projections.operations import Catalog, SinkRoots
from tests.projections import helpers

pytestmark = pytest.mark.timeout(300)
MODULE = str(Path(__file__).with_name("truncate_projections.py"))


def _sql(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def _delta(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    path = catalog.current(name).location("delta")
    if not Path(path, "_delta_log").exists():
        return []
    return list(DeltaTable(path).to_pyarrow_table().to_pylist())


def _truncated_at(dsn: str, stream: str) -> list[tuple[int, dt.datetime]]:
    with ChangelogStore(dsn) as store:
        records = store.read(stream, 1, 1_000_000).to_pylist()
    return [(r["_position"], r["_commit_ts"]) for r in records if r["_op"] == "truncate"]


def check_views(dsn: str, catalog: Catalog, redis_url: str) -> None:
    """Every view equals what SQL says about the source tables."""
    customers = {r[0]: (r[1], r[2]) for r in _sql(dsn, "SELECT id, name, city FROM customers")}
    products = {r[0]: r[1] for r in _sql(dsn, "SELECT id, name FROM products")}

    table = {r["id"]: (r["name"], r["city"]) for r in _delta(catalog, "customer_table")}
    assert table == customers
    assert {r["id"]: (r["name"], r["city"]) for r in _delta(catalog, "customer_names")} == \
        customers

    with RedisCacheReader(redis_url) as reader:
        assert sorted(reader.keys("customer_cache")) == sorted(str(i) for i in customers)
        for key, (name, city) in customers.items():
            expected = {"id": str(key), "name": name} | ({"city": city} if city else {})
            assert reader.get("customer_cache", key) == expected
        labels = {int(k): reader.get("labels", k) for k in reader.keys("labels")}
    expected_labels = {}
    for key in set(customers) | set(products):
        label: dict[str, Any] = {"id": key}
        if key in customers:
            label["customer"] = customers[key][0]
        if key in products:
            label["product"] = products[key]
        expected_labels[key] = label
    assert labels == expected_labels

    search = SearchIndexReader(lambda view: catalog.current(view).location("search"))
    assert search.count("customer_search") == len(customers)
    for key, (name, _) in customers.items():
        assert (search.get("customer_search", key) or {}).get("name") == name

    history = _delta(catalog, "customer_history")
    current = {r["id"]: (r["name"], r["city"]) for r in history if r["current"]}
    assert current == customers
    assert len([r for r in history if r["current"]]) == len(customers)
    for _, truncated in _truncated_at(dsn, "public.customers"):
        for version in history:  # a truncate closes every version that was open at its time
            if version["valid_from"] < truncated:
                assert version["valid_to"] is not None and version["valid_to"] <= truncated

    with ChangelogStore(dsn) as store:
        records = store.read("public.customers", 1, 1_000_000).to_pylist()
    log = sorted(_delta(catalog, "customer_log"), key=lambda r: r["_position"])
    assert [(r["_position"], r["_type"]) for r in log] == [
        (r["_position"], "insert" if r["_op"] == "read" else r["_op"]) for r in records]
    assert DeadLetters(catalog).find("customer_cache") == []
    assert DeadLetters(catalog).find("customer_search") == []
    assert DeadLetters(catalog).find("customer_names") == []
    assert DeadLetters(catalog).find("labels") == []


def _runner(pg, spark, redis_url, tmp_path) -> Runner:
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2)
    return Runner(spark, load_projections(MODULE), config)


def _shop(pg) -> None:
    helpers.create_shop(pg.dsn)
    rng = random.Random(18)
    helpers.write_customers(pg.dsn, rng, 30)
    helpers.write_products(pg.dsn, rng, 30)
    helpers.capture_now(pg.dsn)


def test_a_truncate_reaches_every_target(pg, spark, redis_url, tmp_path):
    _shop(pg)
    with _runner(pg, spark, redis_url, tmp_path) as runner, Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=200)
        check_views(pg.dsn, catalog, redis_url)
        before = len(_sql(pg.dsn, "SELECT id FROM customers"))
        # Changes before the truncate, the truncate, changes after it: one micro-batch each.
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("UPDATE customers SET name = name || ' (old)' WHERE id % 3 = 0")
            conn.execute("INSERT INTO customers VALUES (1000, 'gone', 'x@example.com', 'Oslo')")
            conn.execute("TRUNCATE customers")
            conn.execute("INSERT INTO customers SELECT g, 'new ' || g, NULL, 'Leeds' "
                         "FROM generate_series(1, 12) g")
            conn.execute("UPDATE customers SET city = 'Turin' WHERE id = 2")
            conn.execute("DELETE FROM customers WHERE id = 3")
            conn.execute("TRUNCATE products")
            conn.execute("INSERT INTO products VALUES (5, 'lamp', 'oak lamp', 9.50)")
        helpers.capture_now(pg.dsn)
        runner.run(until_caught_up=True, timeout=200)
        check_views(pg.dsn, catalog, redis_url)
        (_, truncated), = _truncated_at(pg.dsn, "public.customers")
        closed = [r for r in _delta(catalog, "customer_history") if r["valid_to"] == truncated]
        assert len(closed) == before + 1  # the rows of the table when it was truncated
        # A rebuild replays everything in one large batch (read in parallel tasks, the fold's
        # keys not known yet) and makes the same views.
        for name in runner.registry.names():
            runner.request_rebuild(name)
        runner.run(until_caught_up=True, timeout=240)
        assert {catalog.current(name).generation for name in runner.registry.names()} == {2}
        check_views(pg.dsn, catalog, redis_url)


def test_views_equal_the_source_after_capture_recover(pg, spark, redis_url, tmp_path):
    _shop(pg)
    with _runner(pg, spark, redis_url, tmp_path) as runner, Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=200)
        check_views(pg.dsn, catalog, redis_url)
        # An outage: these changes are never streamed (recover drops the slot); the deletes
        # can only reach the views through the truncate record that recover writes.
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM customers WHERE id % 2 = 0")
            conn.execute("UPDATE customers SET city = 'Leeds' WHERE id % 5 = 1")
            conn.execute("INSERT INTO customers VALUES (500, 'late', NULL, 'Turin')")
            conn.execute("DELETE FROM products WHERE id % 2 = 1")
        deleted = _sql(pg.dsn, "SELECT count(*) FROM customers")[0][0]
        assert deleted > 0
        recover(helpers.capture_config(pg.dsn))
        helpers.capture_now(pg.dsn)
        with ChangelogStore(pg.dsn) as store:
            ops = store.read("public.customers", 1, 100_000).column("_op").to_pylist()
        assert "truncate" in ops
        runner.run(until_caught_up=True, timeout=200)
        check_views(pg.dsn, catalog, redis_url)


KILLED = ("customer_table", "customer_history", "labels")


def _batch_ids(catalog: Catalog) -> tuple[int, ...]:
    return helpers.committed_batches(catalog, KILLED)


def _changes(dsn: str, rng: random.Random, round_: int) -> None:
    """Changes around a truncate of customers (and of products every other round)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        base = 100 * (round_ + 1)
        conn.execute("UPDATE customers SET city = %s WHERE id %% 4 = %s",
                     (rng.choice(["Oslo", "Lyon"]), rng.randrange(4)))
        conn.execute("INSERT INTO customers SELECT g, 'pre ' || g, NULL, 'Turin' "
                     "FROM generate_series(%s::int, %s::int) g", (base, base + 5))
        conn.execute("TRUNCATE customers")
        if round_ % 2 == 0:
            conn.execute("TRUNCATE products")
            conn.execute("INSERT INTO products SELECT g, 'p' || g, NULL, 1.00 "
                         "FROM generate_series(1, %s::int) g", (rng.randrange(2, 9),))
        conn.execute("INSERT INTO customers SELECT g, 'post ' || g, NULL, 'Leeds' "
                     "FROM generate_series(1, %s::int) g", (rng.randrange(3, 15),))
        conn.execute("DELETE FROM customers WHERE id = %s", (rng.randrange(1, 4),))
        conn.execute("UPDATE customers SET name = name || '!' WHERE id %% 3 = 0", ())


KILLS = 2  # each kill starts a Spark driver; the finish phase checks every view after them


def test_sigkill_while_applying_truncates(pg, redis_url, tmp_path):
    _shop(pg)
    rng = random.Random(29)
    home = str(tmp_path)
    command = [sys.executable, "-m", "tests.projections.kill_child", "truncate_projections.py",
               pg.dsn, redis_url, home]
    catalog = Catalog(pg.dsn)
    killed_while_busy = 0
    for kill in range(KILLS):
        before = _batch_ids(catalog)
        child = subprocess.Popen([*command, "run"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        # a change first, so that it has something to commit even when its predecessor had
        # processed everything; then the truncates, applied while it is killed
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO customers SELECT 10000 + %s, 'new', NULL, 'Bonn'", (kill,))
        helpers.capture_now(pg.dsn)
        helpers.wait_for_commits(catalog, KILLED, before, timeout=120)
        _changes(pg.dsn, rng, kill)
        helpers.capture_now(pg.dsn)
        time.sleep(rng.uniform(0.0, 2.0))
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        killed_while_busy += _batch_ids(catalog) != before
    assert killed_while_busy >= KILLS // 2, "the children rarely committed: kills proved little"
    child = subprocess.Popen([*command, "finish"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 0 and b"caught up" in out
    check_views(pg.dsn, catalog, redis_url)
    catalog.close()
