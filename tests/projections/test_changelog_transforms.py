"""Stateful transforms over a changelog are refused at registration (issue 18, item 2).

Spark Structured Streaming has no retractions: a streaming aggregation, join or deduplication
over a changelog takes every update and delete record as one more input row, so the view
drifts from the table with every change. The first test shows what such a view becomes (the
issue's exact scenario, against SQL on the source) and that registration now refuses it; the
others go through the operators that are refused and the transforms that stay allowed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import Window, functions as F

from lakefold.projections import (
    Fold,
    Registry,
    Runner,
    RunnerConfig,
    StatefulChangelogError,
    changelog,
    delta_table,
    events,
    projection,
    redis_cache,
)
from lakefold.projections.operations import Catalog, SinkRoots, registering_into
from lakefold.projections.runtime._queries import validate
from lakefold.spark._source_records import source_frame
from tests.projections import helpers

pytestmark = pytest.mark.timeout(240)


def _city_counts(dsn: str) -> dict[str | None, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT city, count(*) FROM customers GROUP BY city").fetchall()
    return {city: int(count) for city, count in rows}


def _naive_stream_counts(spark: Any, dsn: str, checkpoint: Path) -> dict[str | None, int]:
    """What plain Spark streaming makes of ``groupBy("city").count()`` over the changelog."""
    frame = source_frame(spark, dsn, changelog("public.customers"), max_records=1_000)
    query = (frame.groupBy("city").count().writeStream.format("memory")
             .queryName("naive_city_counts").outputMode("complete")
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        query.processAllAvailable()
        rows = spark.sql("SELECT city, `count` FROM naive_city_counts").collect()
    finally:
        query.stop()
    return {row["city"]: int(row["count"]) for row in rows}


def test_count_per_city_over_a_changelog_is_refused_at_registration(pg, spark, tmp_path):
    helpers.create_shop(pg.dsn)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for i in range(10):
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s, %s)",
                         (i, f"n{i}", f"c{i}@example.com", "Leeds" if i < 5 else "Turin"))
        conn.execute("UPDATE customers SET city = 'Leeds' WHERE id IN (5, 6)")  # two moves
        conn.execute("UPDATE customers SET city = city WHERE id = 0")  # a no-op update
        conn.execute("DELETE FROM customers WHERE id IN (1, 2)")  # two deletes
    helpers.capture_now(pg.dsn)
    assert _city_counts(pg.dsn) == {"Leeds": 5, "Turin": 3}
    # Why it is refused: every update and delete counts as one more row.
    assert _naive_stream_counts(spark, pg.dsn, tmp_path / "naive") == {
        "Leeds": 8, "Turin": 5, None: 2}

    registry = Registry()
    with registering_into(registry):
        @projection("city_counts", sources=[changelog("public.customers")],
                    target=delta_table("upsert", keys=["city"]))
        def city_counts(customers):
            return customers.groupBy("city").count()

    roots = SinkRoots.under(tmp_path / "sinks")
    runner = Runner(spark, registry, RunnerConfig(store_dsn=pg.dsn, roots=roots))
    try:
        with pytest.raises(StatefulChangelogError) as refused:
            runner.run(until_caught_up=True, timeout=120)
    finally:
        runner.close()
    message = str(refused.value)
    assert "projection city_counts" in message
    assert "aggregation" in message and "public.customers" in message
    assert "no retractions" in message and "new row" in message
    assert "lakefold.view" in message and "Fold" in message and "lakefold query" in message
    with Catalog(pg.dsn) as catalog:  # nothing was registered or written
        assert catalog.projections() == []
    written = [p for root in (Path(roots.lake), roots.search, Path(roots.checkpoints))
               if root.exists() for p in root.rglob("*")]
    assert written == []


def _changelog_registry(define: Callable[[], object]) -> Registry:
    registry = Registry()
    with registering_into(registry):
        define()
    return registry


def _customers_and_orders(pg) -> None:
    helpers.create_shop(pg.dsn)
    helpers.write_customers(pg.dsn, random.Random(3), 5)
    helpers.capture_now(pg.dsn)
    helpers.append_orders(pg.dsn, random.Random(3), 3)


def _upsert(keys: list[str]) -> Any:
    return delta_table("upsert", keys=keys)


REFUSED = {
    "groupBy count": (lambda c: c.groupBy("city").count(), "an aggregation"),
    "groupBy agg": (lambda c: c.groupBy("city").agg(F.max("id").alias("top")),
                    "an aggregation"),
    "time window": (lambda c: c.groupBy(F.window("_ts", "1 hour").alias("w"), "city").count(),
                    "an aggregation"),
    "dropDuplicates": (lambda c: c.dropDuplicates(["city"]), "a deduplication"),
    "distinct": (lambda c: c.select("city").distinct(), "a deduplication"),
    "window function": (lambda c: c.withColumn(
        "rank", F.row_number().over(Window.partitionBy("city").orderBy("_position"))),
        "a window function"),
    "limit": (lambda c: c.limit(3), "a limit"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_stateful_operators_over_a_changelog_are_refused(case, pg, spark):
    _customers_and_orders(pg)
    transform, operator = REFUSED[case]
    registry = _changelog_registry(lambda: projection(
        "p", sources=[changelog("public.customers")], target=_upsert(["city"]))(transform))
    with pytest.raises(StatefulChangelogError, match=rf"projection p: .*{re.escape(operator)}"):
        validate(spark, registry, pg.dsn)


JOINS: dict[str, Callable[..., Any]] = {
    "self join": (lambda customers: customers.join(
        customers.select("id", F.col("name").alias("other")), "id")),
    "stream-stream join with events": (lambda customers, order: customers.join(
        order.select(F.get_json_object("data", "$.customer").alias("name"),
                     F.col("_position").alias("order_position")), "name")),
    "left join with a static table": (lambda customers: customers.join(
        customers.sparkSession.createDataFrame([("Oslo", "NO")], "city string, country string"),
        "city", "left")),
}


@pytest.mark.parametrize("case", list(JOINS))
def test_joins_with_a_changelog_are_refused(case, pg, spark):
    _customers_and_orders(pg)
    sources = [changelog("public.customers")] + ([events("order")] if "events" in case else [])
    registry = _changelog_registry(lambda: projection(
        "p", sources=sources, target=delta_table("append"))(JOINS[case]))
    with pytest.raises(StatefulChangelogError, match=r"projection p: .*a join"):
        validate(spark, registry, pg.dsn)


FILTERS: dict[str, tuple[Callable[[Any], Any], Any, str | None]] = {
    # name: (transform, target, the column refused; None: allowed)
    "a value into an upsert": (lambda c: c.filter("city = 'Oslo'").select(
        "id", "city", "_position", "_deleted"), _upsert(["id"]), "city"),
    "a derived value into redis": (lambda c: c.withColumn("loud", F.upper("name")).where(
        F.col("loud") != "X").select("id", "loud", "_position", "_deleted"),
        redis_cache(key="id"), "loud"),
    "a value into an scd2 table": (lambda c: c.filter(F.col("name").isNotNull()).select(
        "id", "name", "_position", "_deleted"), delta_table("scd2", keys=["id"]), "name"),
    "the key into an upsert": (lambda c: c.filter(F.col("id") % 2 == 0).select(
        "id", "city", "_position", "_deleted"), _upsert(["id"]), None),
    "the change type into an upsert": (lambda c: c.filter("_type <> 'delete'").select(
        "id", "city", "_position", "_deleted"), _upsert(["id"]), None),
    "a value into an append table": (lambda c: c.filter("city = 'Oslo'").select(
        "id", "city", "_type"), delta_table("append"), None),
}


@pytest.mark.parametrize("case", list(FILTERS))
def test_a_filter_on_what_an_update_changes_is_refused_into_a_keyed_target(case, pg, spark):
    """An update that takes a row out of a filter never reaches the target: a target with a
    row per key would keep the old row. So a filter over a changelog into one may read only
    the key and the change's metadata (found in the plan, whatever the spelling)."""
    _customers_and_orders(pg)
    transform, target, refused = FILTERS[case]
    registry = _changelog_registry(lambda: projection(
        "p", sources=[changelog("public.customers")], target=target)(transform))
    if refused is None:
        assert sorted(validate(spark, registry, pg.dsn)) == ["p"]
        return
    with pytest.raises(StatefulChangelogError) as caught:
        validate(spark, registry, pg.dsn)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"projection p: its transform filters the changelog of "
                           f"public.customers on {refused}, which an update can change")
    assert "Filter on the key (id)" in line and "lakefold.view" in line


def _stateless(customers):
    from pyspark.sql.types import StringType

    shout = F.udf(lambda name: None if name is None else name.upper(), StringType())
    return (customers.filter(F.col("id") >= 0)
            .withColumn("loud", shout("name"))
            .select("id", "loud", "city", "_position", "_deleted"))


def test_stateless_transforms_and_folds_still_register(pg, spark):
    _customers_and_orders(pg)

    def define() -> None:
        projection("per_row", sources=[changelog("public.customers")],
                   target=redis_cache(key="id"))(_stateless)
        projection("both_tables", sources=[changelog("public.customers"),
                                           changelog("public.products")],
                   target=delta_table("append"))(
            lambda customers, products: customers.select("id", "_stream", "_type").unionByName(
                products.select("id", "_stream", "_type")))
        projection("per_customer_orders", sources=[events("order")],
                   target=_upsert(["customer"]))(
            lambda order: order.groupBy(
                F.get_json_object("data", "$.customer").alias("customer")).count())
        fold = Fold("names", sources=[changelog("public.customers")], key="id",
                    schema="id bigint, name string", target=_upsert(["id"]))
        fold.on("insert", "update", "delete")(
            lambda state, record: None if record.type == "delete"
            else {**state, "name": record.data["name"]})

    plans = validate(spark, _changelog_registry(define), pg.dsn)
    assert sorted(plans) == ["both_tables", "names", "per_customer_orders", "per_row"]
    assert plans["per_customer_orders"].stateful and not plans["per_row"].stateful
