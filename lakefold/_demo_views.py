"""The demo's views: the demo shop's four projections (``lakefold._demo_projections``) run by
a ``Runner`` over the captured changelog, shown, rebuilt, and checked against SQL.

``show_views`` runs every projection until it has caught up, prints what each view holds (the
top customers by revenue through ``lakefold query``'s engine, a few cached customers, a search
hit, a product's price history), then rebuilds ``customer_cache`` into generation 2 and
switches to it (readers follow the catalog's pointer), queries it again, and compares every
view with the same data computed by SQL on the source.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold import _shop

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.projections import RedisCacheReader, SearchIndexReader
    from lakefold.projections.operations import Catalog

REVENUE = "revenue_per_customer"
REBUILT = "customer_cache"
REDIS_NAMESPACE = "lakefold-demo"
_REVENUE_SQL = "SELECT customer_id, name, orders, revenue FROM revenue_per_customer"


@dataclass
class ViewsResult:
    """Each view's name and whether it equals the source; the rebuilt view's generations."""

    matches: dict[str, bool] = field(default_factory=dict)
    generations: tuple[int, int] = (1, 1)
    revenue_rows: list[tuple[int, str, int, Decimal]] = field(default_factory=list)
    revenue_path: str = ""


@dataclass(frozen=True)
class _Readers:
    dsn: str
    lake: Path
    catalog: Catalog
    cache: RedisCacheReader
    search: SearchIndexReader


def show_views(spark: SparkSession, dsn: str, *, home: Path, lake: Path, redis_url: str,
               console: Console) -> ViewsResult:
    """Run, show, rebuild and check the four demo views; see the module docstring. ``home``
    and ``lake`` are emptied first, and the Redis namespace dropped, so a rerun starts clean."""
    from lakefold.projections import (
        RedisCacheReader,
        Runner,
        RunnerConfig,
        SearchIndexReader,
        load_projections,
    )
    from lakefold.projections.operations import Catalog, SinkRoots, drop_prefix

    for directory in (home, lake):
        shutil.rmtree(directory, ignore_errors=True)
    drop_prefix(redis_url, REDIS_NAMESPACE + ":")
    roots = SinkRoots(lake=lake.resolve(), search=(home / "search").resolve(),
                      checkpoints=(home / "checkpoints").resolve(),
                      redis_namespace=REDIS_NAMESPACE)
    config = RunnerConfig(store_dsn=dsn, roots=roots, redis_url=redis_url, poll_seconds=0.1,
                          trigger_seconds=0.1)
    result = ViewsResult()
    registry = load_projections("lakefold._demo_projections")
    with Runner(spark, registry, config) as runner, \
            Catalog(dsn) as catalog, \
            RedisCacheReader(redis_url, namespace=REDIS_NAMESPACE, pointer_ttl=0) as cache:
        names = ", ".join(p.name for p in runner.projections)
        began = time.monotonic()
        with console.status(f"running the projections {names}"):
            runner.run(until_caught_up=True, timeout=300)
        console.print(f"{len(runner.projections)} projections caught up with the changelog "
                      f"in {time.monotonic() - began:.1f} s")
        readers = _Readers(dsn, lake, catalog, cache,
                           SearchIndexReader(lambda view: catalog.current(view).location("search"),
                                             pointer_ttl=0))
        _print_views(readers, console)
        before = catalog.current(REBUILT).generation
        with console.status(f"rebuilding {REBUILT}: replaying its history into generation "
                            f"{before + 1}, then switching"):
            began = time.monotonic()
            # only the rebuilt projection runs now (its live and new generations): the
            # other views are up to date, and restarting their queries would only slow it
            with Runner(spark, registry, replace(config, only=(REBUILT,))) as rebuilder:
                building = rebuilder.request_rebuild(REBUILT)
                rebuilder.run(until_caught_up=True, timeout=300)
        after = catalog.current(REBUILT)
        result.generations = (before, after.generation)
        console.print(f"rebuilt [bold]{REBUILT}[/] in {time.monotonic() - began:.1f} s: "
                      f"generation {building.generation} replayed from position 0, then "
                      f"switched live (generation {before} -> {after.generation}); readers "
                      "resolve the name through the catalog")
        cached = cache.get(REBUILT, 1)
        console.print(f"queried again: get({REBUILT!r}, 1) = {cached} (from generation "
                      f"{after.generation})")
        result.revenue_rows = _revenue(readers)
        result.revenue_path = catalog.current(REVENUE).location("delta")
        result.matches = _check(readers, result.revenue_rows)
    _print_checks(console, result)
    return result


def _revenue(readers: _Readers) -> list[tuple[int, str, int, Decimal]]:
    """The revenue view as ``lakefold query`` reads it (the catalog's live generation)."""
    from lakefold.projections.operations import ProjectionTableCatalog
    from lakefold.spark import Engine, run_query

    tables = ProjectionTableCatalog(store_dsn=readers.dsn, lake_path=readers.lake)
    rows = run_query(_REVENUE_SQL + " ORDER BY customer_id", tables,
                     engine=Engine.LOCAL).to_pylist()
    return [(int(r["customer_id"]), str(r["name"]), int(r["orders"]), Decimal(r["revenue"]))
            for r in rows]


def _print_views(readers: _Readers, console: Console) -> None:
    top = sorted(_revenue(readers), key=lambda r: r[3], reverse=True)[:5]
    table = Table(title="revenue_per_customer (Delta upsert; lakefold query, top 5)")
    for column in ("customer", "name", "orders", "revenue"):
        table.add_column(column)
    for customer, name, orders, revenue in top:
        table.add_row(str(customer), name, str(orders), f"{revenue:,.2f}")
    console.print(table)

    cache = Table(title="customer_cache (Redis hash per customer; get(view, key))")
    for column in ("key", "name", "email", "city"):
        cache.add_column(column)
    for key in sorted(readers.cache.keys("customer_cache"), key=int)[:3]:
        row = readers.cache.get("customer_cache", key) or {}
        cache.add_row(key, row.get("name", ""), row.get("email", ""), row.get("city", ""))
    console.print(cache)

    hits = readers.search.search("product_search", "oak lamp", limit=3)
    found = Table(title='product_search (Tantivy): "oak lamp", best 3')
    for column in ("id", "name", "score", "matched (why it ranks here)"):
        found.add_column(column)
    for hit in hits:
        matched = "; ".join(f"{f}: {m.marked()}" for f, m in hit.matched.items())
        found.add_row(hit.key, escape(str(hit.document.get("name", ""))), f"{hit.score:.2f}",
                      escape(matched))
    console.print(found)

    history = _price_history(readers.catalog)
    product = max(history, key=lambda k: len(history[k]))
    versions = Table(title=f"price_history (Delta SCD type 2): product {product}")
    for column in ("price", "valid_from", "valid_to", "current"):
        versions.add_column(column)
    for row in history[product]:
        versions.add_row(str(row["price"]), str(row["valid_from"]), str(row["valid_to"]),
                         str(row["current"]))
    console.print(versions)


def _price_history(catalog: Catalog) -> dict[int, list[dict[str, Any]]]:
    from deltalake import DeltaTable

    rows = DeltaTable(catalog.current("price_history").location("delta")).to_pyarrow_table()
    history: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows.to_pylist(), key=lambda r: (r["id"], r["valid_from"])):
        history.setdefault(int(row["id"]), []).append(row)
    return history


def _check(readers: _Readers, revenue: list[tuple[int, str, int, Decimal]]
           ) -> dict[str, bool]:
    """Each view against the same data computed by SQL on the source."""
    with psycopg.connect(readers.dsn, autocommit=True) as conn:
        expected_revenue = _shop.revenue_per_customer(conn)
        customers = conn.execute("SELECT id, name, email, city FROM shop.customers").fetchall()
        products = conn.execute("SELECT id, name, description, price FROM shop.products"
                                ).fetchall()
    cache = readers.cache
    cached = {key: cache.get("customer_cache", key) for key in cache.keys("customer_cache")}
    search = readers.search
    documents = {str(p[0]): search.get("product_search", p[0]) or {} for p in products}
    history = _price_history(readers.catalog)
    current = {pid: [r["price"] for r in rows if r["current"]] for pid, rows in history.items()}
    return {
        "revenue_per_customer": revenue == expected_revenue,
        "customer_cache": cached == {str(c[0]): {"id": str(c[0]), "name": c[1], "email": c[2],
                                                 "city": c[3]} for c in customers},
        "product_search": search.count("product_search") == len(products) and all(
            (documents[str(p[0])].get("name"), documents[str(p[0])].get("description"))
            == (p[1], p[2]) for p in products),
        "price_history": current == {p[0]: [p[3]] for p in products},
    }


def _print_checks(console: Console, result: ViewsResult) -> None:
    for view, ok in result.matches.items():
        verdict = "[green]equals[/]" if ok else "[red]DIFFERS FROM[/]"
        console.print(f"{view} {verdict} the same data computed by SQL on the source")
