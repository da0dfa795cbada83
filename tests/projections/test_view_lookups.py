"""Stream-table joins that replay to the same answer: order events enriched with their
customer's city as of each event's commit, while the customers change under a running capture
(updates, deletes, re-inserts, changes in the event's own transaction, and a customer changed
and committed while an append's transaction was still open). After every batch the view equals
what PostgreSQL said inside each appending transaction just before it committed; later changes
of the customers leave it alone, and a rebuild gives the same rows. The ``latest`` lookup
follows the table at feed time (and a rebuild shows the difference). Bad lookups are refused."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st
from pydantic import BaseModel

from lakefold.capture import Capture, CaptureConfig
from lakefold.capture._options import HeartbeatPolicy
from lakefold.eventstore import EventStore
from lakefold.projections import ProjectionOptions, Runner, RunnerConfig, lookup
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog, events
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import ProjectionDefinitionError, UnknownSourceError
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.schemas import EventRegistry
from tests.capture.conftest import capture_now, execute, running_capture
from tests.fixtures.postgres import TestDatabase
from tests.projections.window_oracle import table

pytestmark = pytest.mark.timeout(600)

QUERY = "SELECT position, customer_id, amount, city, name FROM orders"


class OrderPlaced(BaseModel):
    customer_id: int | None
    amount: int


def _types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(OrderPlaced, name="order.placed")
    return registry


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        for name, as_of in (("at_commit", "commit"), ("at_feed", "latest")):
            view(name, inputs={"orders": events("order", types=["order.placed"])},
                 key=["position"], target=delta_table("upsert", keys=["position"]),
                 registry=_types(), query=QUERY,
                 options=ProjectionOptions(max_records_per_batch=3),  # several batches
                 enrich={"orders": lookup(changelog("public.customers"), on="customer_id",
                                          columns=["city", "name"], as_of=as_of)})
    return registry


@pytest.fixture
def capturing(shop: CaptureConfig) -> Iterator[CaptureConfig]:
    """The shop's capture running in the background, with frequent heartbeats."""
    config = replace(shop, heartbeat=HeartbeatPolicy(interval=dt.timedelta(seconds=0.2)))
    stop, thread, errors = running_capture(config)
    try:
        yield config
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors


#: Examples share the database, so a shrunk example would not replay the same: not shrunk.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)

# one step: ("order", customer) | ("move", customer) | ("delete", customer) |
# ("insert", customer) | ("order_and_move", customer): a move in the order's transaction |
# ("order_around_move", customer): a move committed while the order's transaction is open
STEPS = st.lists(st.lists(st.tuples(
    st.sampled_from(["order", "order", "order", "move", "delete", "insert", "order_and_move",
                     "order_around_move"]),
    st.integers(0, 8)), min_size=1, max_size=12), min_size=1, max_size=3)


def test_enrichment_as_of_commit_equals_postgres_and_survives_a_rebuild(
        spark: Any, capturing: CaptureConfig, tmp_path: Path) -> None:
    dsn = capturing.source_dsn
    store = EventStore(dsn, registry=_types())
    store.install()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    #: event id → (customer_id, amount, city, name) as PostgreSQL said at the event's commit
    expected: dict[str, tuple[Any, ...]] = {}
    counter = [0]

    def seen(conn: psycopg.Connection[Any], customer: int | None) -> tuple[Any, Any]:
        row = conn.execute("SELECT city, name FROM customers WHERE id = %s",
                           (customer,)).fetchone()
        return (None, None) if row is None else (row[0], row[1])

    def move(conn: psycopg.Connection[Any], customer: int) -> None:
        counter[0] += 1
        conn.execute("UPDATE customers SET city = %s, name = name || '+' WHERE id = %s",
                     (f"city-{counter[0]}", customer))

    def order(customer: int, *, move_inside: bool = False, move_around: bool = False) -> None:
        counter[0] += 1
        number, who = counter[0], None if customer == 0 else customer
        with store.transaction() as unit:
            if move_inside:
                move(unit.connection, customer)
            result = unit.append(f"order-{number}", [OrderPlaced(
                customer_id=who, amount=number)])
            if move_around:  # another session changes the customer and commits first
                with psycopg.connect(dsn, autocommit=True) as other:
                    move(other, customer)
            city, name = seen(unit.connection, who)
        expected[str(result.events[0].event_id)] = (who, number, city, name)

    @settings(max_examples=3, deadline=None, derandomize=True, phases=NO_SHRINK,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @example([[("order", 1), ("move", 1), ("order_around_move", 2), ("order_and_move", 3),
               ("delete", 4), ("order", 4), ("insert", 4), ("order", 4), ("order", 0)]])
    @given(STEPS)
    def run(batches: list[list[tuple[str, int]]]) -> None:
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog, \
                psycopg.connect(dsn, autocommit=True) as conn:
            for batch in batches:
                for step, customer in batch:
                    if step == "move" and customer:
                        move(conn, customer)
                    elif step == "delete":
                        conn.execute("DELETE FROM customers WHERE id = %s", (customer,))
                    elif step == "insert":
                        conn.execute("INSERT INTO customers VALUES (%s, %s, 'new') "
                                     "ON CONFLICT DO NOTHING", (customer, f"c{customer}"))
                    elif step.startswith("order"):
                        order(customer, move_inside=step == "order_and_move" and customer > 0,
                              move_around=step == "order_around_move" and customer > 0)
                runner.run(until_caught_up=True, timeout=120)
                assert _rows(conn, catalog, "at_commit") == _oracle(conn, expected)

    try:
        # An order recorded before any lookup view installed the commit markers has no commit
        # LSN: it is enriched as of the start of the table's history (the capture's snapshot),
        # not with the move committed before it.
        with psycopg.connect(dsn, autocommit=True) as conn:
            move(conn, 5)
        early = store.append("order-early", [OrderPlaced(customer_id=5, amount=0)])
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog, \
                psycopg.connect(dsn, autocommit=True) as conn:
            runner.run(until_caught_up=True, timeout=120)
            assert _rows(conn, catalog, "at_commit") == [
                (_positions(conn)[str(early.events[0].event_id)], 5, 0, "Lima", "c5")]
        expected[str(early.events[0].event_id)] = (5, 0, "Lima", "c5")
        run()
        with Catalog(dsn) as catalog, psycopg.connect(dsn, autocommit=True) as conn:
            live = _rows(conn, catalog, "at_commit")
            assert live == _oracle(conn, expected)
            assert any(r[3] is None for r in live) and any(r[3] for r in live)
            fed = _rows(conn, catalog, "at_feed")
            # every customer changes: the enriched rows stay as they were
            conn.execute("UPDATE customers SET city = city || '/later'")
            conn.execute("DELETE FROM customers WHERE id = 1")
            with Runner(spark, _registry(), config) as runner:
                order(2)
                runner.run(until_caught_up=True, timeout=120)
                live = _rows(conn, catalog, "at_commit")
                assert live == _oracle(conn, expected)
                assert _rows(conn, catalog, "at_feed")[:len(fed)] == fed
                for name in ("at_commit", "at_feed"):
                    runner.request_rebuild(name)
                runner.run(until_caught_up=True, timeout=180)
            assert catalog.current("at_commit").generation == 2
            assert _rows(conn, catalog, "at_commit") == live  # replay-stable
            # the latest-row lookup is not: rebuilt, it shows the customers as they are now
            current: dict[int, str] = dict(
                conn.execute("SELECT id, city FROM customers").fetchall())
            rebuilt = _rows(conn, catalog, "at_feed")
            assert [r[3] for r in rebuilt] == [current.get(r[1]) for r in rebuilt]
            assert rebuilt != fed + rebuilt[len(fed):]
    finally:
        store.close()


def _oracle(conn: psycopg.Connection[Any], expected: dict[str, tuple[Any, ...]]
            ) -> list[tuple[Any, ...]]:
    positions = _positions(conn)
    return sorted((positions[e], *values) for e, values in expected.items())


def _positions(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {str(e): int(p) for e, p in conn.execute(
        "SELECT e.event_id, p.first_position + e.ordinal FROM lakefold.events e "
        "JOIN lakefold.event_positions p ON p.xid = e.xid WHERE e.category = 'order'")}


def _rows(conn: psycopg.Connection[Any], catalog: Catalog, name: str) -> list[tuple[Any, ...]]:
    del conn
    return sorted((r["position"], r["customer_id"], r["amount"], r["city"], r["name"])
                  for r in table(catalog, name))


def test_lookups_that_cannot_work_are_refused(spark: Any, shop: CaptureConfig) -> None:
    placed = {"orders": events("order", types=["order.placed"])}

    def check(enrich: Any, *, inputs: Any = placed, query: str = QUERY) -> None:
        views = Registry()
        with registering_into(views):
            view("v", inputs=inputs, key=["position"], query=query,
                 target=delta_table("upsert", keys=["position"]), registry=_types(),
                 enrich=enrich)
        plan_views(spark, views.views, shop.source_dsn)

    customers = "public.customers"
    with pytest.raises(ProjectionDefinitionError, match="as_of='soon'; use 'commit'"):
        lookup(customers, on="customer_id", as_of="soon")
    with pytest.raises(ProjectionDefinitionError, match="on= names the event columns"):
        lookup(customers, on=[])
    with pytest.raises(ProjectionDefinitionError, match="enrich names 'customers', which is a "
                       "changelog"):
        check({"customers": lookup(customers, on="id")},
              inputs=placed | {"customers": changelog(customers)})
    with pytest.raises(ProjectionDefinitionError, match="is not a lookup"):
        check({"orders": "customers"})
    with pytest.raises(UnknownSourceError, match=r"lookup\('public.nope'\)"):
        check({"orders": lookup("public.nope", on="customer_id")})
    with pytest.raises(ProjectionDefinitionError, match="the events have no column 'customer'"):
        check({"orders": lookup(customers, on="customer")})
    with pytest.raises(ProjectionDefinitionError, match=r"names 2 column\(s\).*key has 1"):
        check({"orders": lookup(customers, on=["customer_id", "amount"])})
    with pytest.raises(ProjectionDefinitionError, match="event column type is string, but"):
        check({"orders": lookup(customers, on="type")})
    with pytest.raises(ProjectionDefinitionError, match="the table has no column 'town'"):
        check({"orders": lookup(customers, on="customer_id", columns=["town"])})
    with pytest.raises(ProjectionDefinitionError, match="'type' is already a column"):
        check({"orders": lookup(customers, on="customer_id", columns={"city": "type"})})
    check({"orders": lookup(customers, on="customer_id", columns=["city", "name"])})


def test_a_lookup_as_of_commit_needs_the_events_in_the_captured_database(
        spark: Any, pg: TestDatabase, store_db: TestDatabase, tmp_path: Path) -> None:
    """The table is captured from one database into a store in another, where the events
    are: no common commit order, so the view is refused, naming both and the way out."""
    execute(pg.dsn, "CREATE TABLE customers (id int PRIMARY KEY, name text, city text)",
            "INSERT INTO customers VALUES (1, 'a', 'Oslo')")
    capture = CaptureConfig(source_dsn=pg.dsn, store_dsn=store_db.dsn, tables=("customers",),
                            slot="elsewhere")
    Capture(capture).setup()
    capture_now(capture)
    store = EventStore(store_db.dsn, registry=_types())
    store.install()
    store.append("order-1", [OrderPlaced(customer_id=1, amount=5)])
    store.close()
    config = RunnerConfig(store_dsn=store_db.dsn, roots=SinkRoots.under(tmp_path))
    with Runner(spark, _registry(), config) as runner, \
            pytest.raises(ProjectionDefinitionError, match=(
                f"view at_commit: input orders: lookup\\('public.customers'\\) as of commit "
                f"needs the events and the table in one database .* captured from database "
                f"{pg.name} .* events are in database {store_db.name} .* as_of='latest'")):
        runner.run(until_caught_up=True, timeout=60)
