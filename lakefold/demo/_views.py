"""The demo's views: the demo shop's projections and views (``lakefold.demo.projections``)
run by a ``Runner`` over the captured changelog, shown, changed live, rebuilt, and checked
against SQL.

``show_views`` runs everything until it has caught up, prints what each view holds (the top
customers by revenue through ``lakefold query``'s engine, a few cached customers, a search
hit, a product's price history, order lines and revenue by city), then moves a customer to
another city and deletes one of their orders, captures that and shows the two cities' rows of
``revenue_by_city`` before and after; then it rebuilds ``customer_cache`` into generation 2 and
switches to it (readers follow the catalog's pointer), queries it again, and compares every
view with the same data computed by SQL on the source.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold.demo import _shop
from lakefold.demo._events import ORDERS_PER_MINUTE_SQL, OrderEvents

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.projections import RedisCacheReader, SearchIndexReader
    from lakefold.projections.operations import Catalog

REVENUE = "revenue_per_customer"
REBUILT = "customer_cache"
WINDOWED = "orders_per_minute"
ENRICHED = "orders_with_city"
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
               capture: Callable[[], None], console: Console,
               events: OrderEvents) -> ViewsResult:
    """Run, show, change, rebuild and check the demo views; see the module docstring.
    ``capture`` brings the changelog up to the source. ``home`` and ``lake`` are emptied
    first, and the Redis namespace dropped, so a rerun starts clean."""
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
    registry = load_projections("lakefold.demo.projections")
    with Runner(spark, registry, config) as runner, \
            Catalog(dsn) as catalog, \
            RedisCacheReader(redis_url, namespace=REDIS_NAMESPACE, pointer_ttl=0) as cache:
        names = ", ".join([*(p.name for p in runner.projections), *registry.views])
        began = time.monotonic()
        with console.status(f"running the projections and views {names}"):
            runner.run(until_caught_up=True, timeout=300)
        console.print(f"{len(runner.projections)} projections and {len(registry.views)} views "
                      f"caught up with the changelog in {time.monotonic() - began:.1f} s")
        readers = _Readers(dsn, lake, catalog, cache,
                           SearchIndexReader(lambda view: catalog.current(view).location("search"),
                                             pointer_ttl=0))
        _print_views(readers, console)
        _live_change(readers, console, capture=capture,
                     catch_up=lambda: _run_all(spark, registry, config))
        _event_time(readers, console, events, capture=capture,
                    catch_up=lambda: _run_all(spark, registry, config))
        before = catalog.current(REBUILT).generation
        enriched = _table(catalog, ENRICHED, "position")
        with console.status(f"rebuilding {REBUILT} and {ENRICHED}: replaying their history "
                            f"into new generations, then switching"):
            began = time.monotonic()
            # only the rebuilt views run now (their live and new generations): the others
            # are up to date, and restarting their queries would only slow it
            with Runner(spark, registry, replace(config, only=(REBUILT, ENRICHED))) \
                    as rebuilder:
                building = rebuilder.request_rebuild(REBUILT)
                rebuilder.request_rebuild(ENRICHED)
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
        result.matches = _check(readers, result.revenue_rows) | _event_checks(readers, events)
        result.matches[f"{ENRICHED} rebuilt"] = \
            catalog.current(ENRICHED).generation > 1 and \
            _table(catalog, ENRICHED, "position") == enriched
        console.print(f"rebuilt [bold]{ENRICHED}[/] (generation "
                      f"{catalog.current(ENRICHED).generation}): the same {len(enriched)} rows, "
                      "each order with its customer's city as of the order, although customers "
                      "moved since")
    _print_checks(console, result)
    return result


def _run_all(spark: SparkSession, registry: Any, config: Any) -> None:
    from lakefold.projections import Runner

    with Runner(spark, registry, config) as runner:
        runner.run(until_caught_up=True, timeout=300)


def _by_city(catalog: Catalog) -> dict[str, dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(catalog.current("revenue_by_city").location("delta")).to_pyarrow_table()
    return {str(row["city"]): row for row in rows.to_pylist()}


def _live_change(readers: _Readers, console: Console, *, capture: Callable[[], None],
                 catch_up: Callable[[], None]) -> None:
    """Move a customer to another city and delete one of their orders, then show what the
    views did with it."""
    with psycopg.connect(readers.dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT o.customer_id, c.city, min(o.id) FROM shop.orders o JOIN shop.customers c "
            "ON c.id = o.customer_id GROUP BY o.customer_id, c.city HAVING count(*) > 1 "
            "ORDER BY o.customer_id LIMIT 1").fetchone()
        assert found is not None  # noqa: S101 - the workload gives customers several orders
        customer, city, order = found
        moved_to = "Ghent" if city != "Ghent" else "Leeds"
        before = _by_city(readers.catalog)
        with conn.transaction():
            conn.execute("UPDATE shop.customers SET city = %s WHERE id = %s", (moved_to, customer))
            conn.execute("DELETE FROM shop.orders WHERE id = %s", (order,))
    began = time.monotonic()
    with console.status(f"live: customer {customer} moves from {city} to {moved_to}, and "
                        f"their order {order} is deleted; capturing and catching up"):
        capture()
        catch_up()
    after = _by_city(readers.catalog)
    table = Table(title=f"revenue_by_city (a view over order_lines) before → after customer "
                        f"{customer} moved from {city} to {moved_to} and order {order} was "
                        f"deleted ({time.monotonic() - began:.1f} s)")
    for column in ("city", "orders", "revenue", "customers"):
        table.add_column(column)
    for name in (city, moved_to):
        old, new = before.get(name, {}), after.get(name, {})
        table.add_row(name, *(f"{old.get(c, 0)} → {new.get(c, 0)}"
                              for c in ("orders", "revenue", "customers")))
    console.print(table)


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

    by_city = sorted(_by_city(readers.catalog).values(), key=lambda r: r["revenue"],
                     reverse=True)[:5]
    cities = Table(title="revenue_by_city (a view: GROUP BY city over the order_lines view; "
                         "Delta upsert, top 5)")
    for column in ("city", "orders", "revenue", "average", "smallest", "largest", "customers"):
        cities.add_column(column)
    for row in by_city:
        cities.add_row(row["city"], str(row["orders"]), f"{row['revenue']:,.2f}",
                       f"{row['average']:,.2f}", str(row["smallest"]), str(row["largest"]),
                       str(row["customers"]))
    console.print(cities)

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
        **_view_checks(readers),
    }


def _view_checks(readers: _Readers) -> dict[str, bool]:
    """The two views, row for row, against the same SQL on the source."""
    from deltalake import DeltaTable

    def table(name: str, key: str) -> dict[Any, dict[str, Any]]:
        rows = DeltaTable(readers.catalog.current(name).location("delta")).to_pyarrow_table()
        out = {}
        for row in rows.to_pylist():
            if "average" in row:
                row["average"] = Decimal(row["average"]).quantize(Decimal("0.000001"))
            out[row[key]] = row
        return out

    with psycopg.connect(readers.dsn, autocommit=True) as conn, \
            conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        lines = {r["order_id"]: r for r in cur.execute(_shop.ORDER_LINES_SQL).fetchall()}
        cities = {r["city"]: r for r in cur.execute(_shop.REVENUE_BY_CITY_SQL).fetchall()}
    return {"order_lines": table("order_lines", "order_id") == lines,
            "revenue_by_city": table("revenue_by_city", "city") == cities}


def _print_checks(console: Console, result: ViewsResult) -> None:
    for view, ok in result.matches.items():
        verdict = "[green]equals[/]" if ok else "[red]DIFFERS FROM[/]"
        other = "its live generation's rows" if view.endswith(" rebuilt") else \
            "the same data computed by SQL on the source"
        console.print(f"{view} {verdict} {other}")


def _table(catalog: Catalog, name: str, key: str) -> dict[Any, dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(catalog.current(name).location("delta")).to_pyarrow_table().to_pylist()
    return {row[key]: row for row in rows}


def _event_time(readers: _Readers, console: Console, events: OrderEvents, *,
                capture: Callable[[], None], catch_up: Callable[[], None]) -> None:
    """A customer with order events moves; the shop then places another order event for them
    and one 90 s late; show the corrected window and the customer's enriched orders."""
    placed, customer, city = next(iter(events.seen.values()))
    (late_order, _, _), *_ = list(events.seen.values())[1:]
    with psycopg.connect(readers.dsn, autocommit=True) as conn:
        moved_to = "Turin" if city != "Turin" else "Oslo"
        conn.execute("UPDATE shop.customers SET city = %s WHERE id = %s", (moved_to, customer))
        found = conn.execute("SELECT id FROM shop.orders WHERE customer_id = %s AND id <> %s "
                             "ORDER BY id LIMIT 1", (customer, placed)).fetchone()
    events.append(int(found[0]) if found else placed, events.newest + dt.timedelta(seconds=3))
    window = (events.newest - dt.timedelta(seconds=90)).replace(second=0, microsecond=0)
    before = _table(readers.catalog, WINDOWED, "window_start").get(window, {})
    events.late_order(late_order)
    began = time.monotonic()
    with console.status(f"live: customer {customer} moves from {city} to {moved_to} and "
                        "orders again; an order event arrives 90 s late; capturing and "
                        "catching up"):
        capture()
        catch_up()
    after = _table(readers.catalog, WINDOWED, "window_start").get(window, {})
    windows = Table(title=f"{WINDOWED} (1-minute tumbling windows of event time, 2 minutes of "
                          f"lateness): the window of the late event, before → after "
                          f"({time.monotonic() - began:.1f} s)")
    for column in ("window_start", "orders", "amount", "window_final"):
        windows.add_column(column)
    windows.add_row(str(window), f"{before.get('orders')} → {after.get('orders')}",
                    f"{before.get('amount', 0):,.2f} → {after.get('amount', 0):,.2f}",
                    f"{before.get('window_final')} → {after.get('window_final')}")
    console.print(windows)
    enriched = Table(title=f"{ENRICHED} (each order event with its customer's city as of the "
                           f"event's commit): customer {customer}")
    for column in ("position", "order_id", "city"):
        enriched.add_column(column)
    rows = [r for r in _table(readers.catalog, ENRICHED, "position").values()
            if r["customer_id"] == customer]
    for row in sorted(rows, key=lambda r: r["position"]):
        enriched.add_row(str(row["position"]), str(row["order_id"]), str(row["city"]))
    console.print(enriched)


def _event_checks(readers: _Readers, events: OrderEvents) -> dict[str, bool]:
    """The two event views against SQL over the event store and what the shop saw."""
    with psycopg.connect(readers.dsn, autocommit=True) as conn:
        windows = {r[0]: (r[1], r[2]) for r in conn.execute(ORDERS_PER_MINUTE_SQL)}
        cities = events.expected_cities(conn)
    have = {k: (r["orders"], r["amount"]) for k, r in
            _table(readers.catalog, WINDOWED, "window_start").items()}
    enriched = {k: (r["order_id"], r["customer_id"], r["city"]) for k, r in
                _table(readers.catalog, ENRICHED, "position").items()}
    return {WINDOWED: have == windows, ENRICHED: enriched == cities}
