"""Views over events of the event store: an aggregate over one event type and a join of events
with a captured table, kept equal to the same SQL over ``lakefold.events`` and the source table
after every batch, whatever is appended, upcast or deleted (soft and hard); a rebuild replays
to the same rows; definitions that cannot work are refused with what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings, strategies as st
from pydantic import BaseModel

from lakefold.capture import CaptureConfig
from lakefold.eventstore import EventStore
from lakefold.projections import DeadLetters, Runner, RunnerConfig
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog, events
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.schemas import EventRegistry, NewEvent
from tests.capture.conftest import capture_now, execute

pytestmark = pytest.mark.timeout(600)


class OrderPlaced(BaseModel):
    customer_id: int
    amount: int  # cents
    note: str | None = None


class OrderShipped(BaseModel):
    carrier: str


def _event_registry() -> EventRegistry:
    registry = EventRegistry()
    registry.add(OrderPlaced, name="order.placed", version=2)
    registry.add(OrderShipped, name="order.shipped")
    # version 1 called the amount "total"
    registry.add_upcaster("order.placed", from_version=1, upcaster=lambda d: {
        **{k: v for k, v in d.items() if k != "total"}, "amount": d["total"]})
    return registry


REVENUE = ("SELECT customer_id, count(*) AS orders, sum(amount) AS revenue, "
           "max(amount) AS largest FROM placed GROUP BY customer_id")
WITH_CITY = ("SELECT p.position, p.stream_id, p.amount, c.city FROM placed p "
             "LEFT JOIN customers c ON p.customer_id = c.id")
ORACLE_REVENUE = """
    SELECT (data->>'customer_id')::int, count(*), sum(coalesce(data->>'amount',
           data->>'total')::int), max(coalesce(data->>'amount', data->>'total')::int)
    FROM lakefold.events WHERE category = 'order' AND type = 'order.placed' AND NOT deleted
      AND data->>'customer_id' ~ '^[0-9]+$'
    GROUP BY 1"""
ORACLE_WITH_CITY = """
    SELECT e.stream_id, e.stream_version, coalesce(e.data->>'amount', e.data->>'total')::int,
           c.city
    FROM lakefold.events e LEFT JOIN customers c ON c.id = (e.data->>'customer_id')::int
    WHERE e.category = 'order' AND e.type = 'order.placed' AND NOT e.deleted
      AND e.data->>'customer_id' ~ '^[0-9]+$'"""
#: Placed events whose payload the model cannot read: each view's dead letters.
UNREADABLE = """
    SELECT p.first_position + e.ordinal FROM lakefold.events e JOIN lakefold.event_positions p
    ON p.xid = e.xid WHERE e.category = 'order' AND e.type = 'order.placed'
    AND NOT e.deleted AND coalesce(e.data->>'customer_id', '') !~ '^[0-9]+$'"""


def _registry() -> Registry:
    registry = Registry()
    types = _event_registry()
    # a type given by its model class is named as the registry names it
    placed = events("order", types=[OrderPlaced])
    with registering_into(registry):
        view("revenue_by_customer", inputs={"placed": placed}, key="customer_id",
             query=REVENUE, target=delta_table("upsert", keys=["customer_id"]),
             registry=types)
        view("placed_with_city", inputs={"placed": placed,
                                          "customers": changelog("public.customers")},
             key="position", query=WITH_CITY, registry=types,
             target=delta_table("upsert", keys=["position"]))
    return registry


def _rows(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(
        catalog.current(name).location("delta")).to_pyarrow_table().to_pylist()
    return rows


def _check(dsn: str, catalog: Catalog) -> None:
    with psycopg.connect(dsn) as conn:
        revenue = {r[0]: (r[1], r[2], r[3]) for r in conn.execute(ORACLE_REVENUE)}
        lines = sorted(conn.execute(ORACLE_WITH_CITY).fetchall())
    assert {r["customer_id"]: (r["orders"], r["revenue"], r["largest"])
            for r in _rows(catalog, "revenue_by_customer")} == revenue
    got = _rows(catalog, "placed_with_city")
    assert len({r["position"] for r in got}) == len(got)
    # one placed event per stream, at its version 1
    assert sorted((r["stream_id"], 1, r["amount"], r["city"]) for r in got) == lines


# an operation: ("place", customer, amount, old_version), ("ship", i), ("delete", i, hard),
# ("move", customer, city), ("garble", amount, lacking): a placed event the model cannot read
# (a customer that is not a number, or no customer at all: a required field missing)
OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("place"), st.integers(1, 8), st.integers(0, 10_000), st.booleans()),
    st.tuples(st.just("garble"), st.integers(0, 10), st.booleans()),
    st.tuples(st.just("ship"), st.integers(0, 30)),
    st.tuples(st.just("delete"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("move"), st.integers(1, 6), st.sampled_from(["Oslo", "Lima", "Pune"])),
), min_size=1, max_size=12)


def _apply(dsn: str, store: EventStore, operations: list[tuple[Any, ...]], counter: list[int]
           ) -> bool:
    """Apply the operations; True when a captured table changed."""
    moved = False
    for op in operations:
        placed = [f"order-{i}" for i in range(counter[0])]
        if op[0] == "place":
            _, customer, amount, old = op
            data = {"customer_id": customer, ("total" if old else "amount"): amount}
            store.append(f"order-{counter[0]}", [NewEvent(
                type="order.placed", data=data, schema_version=1 if old else 2)])
            counter[0] += 1
        elif op[0] == "garble":
            data = {"amount": op[1]} if op[2] else {"customer_id": "nobody", "amount": op[1]}
            store.append(f"order-{counter[0]}", [NewEvent(
                type="order.placed", data=data, schema_version=2)])
            counter[0] += 1
        elif op[0] == "ship" and placed:
            stream = placed[op[1] % len(placed)]
            if stream in _deleted(dsn):
                continue
            store.append(stream, [NewEvent(type="order.shipped", data={"carrier": "dhl"})])
        elif op[0] == "delete" and placed:
            stream = placed[op[1] % len(placed)]
            if stream in _deleted(dsn):
                continue
            store.delete_stream(stream, hard=op[2])
        elif op[0] == "move":
            execute(dsn, f"UPDATE customers SET city = '{op[2]}' WHERE id = {op[1]}")
            moved = True
    return moved


def _deleted(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            "SELECT DISTINCT stream_id FROM lakefold.events WHERE type = '$stream.deleted'")}


def test_views_over_events_equal_sql_over_the_event_store(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    store = EventStore(dsn)
    store.install()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    counter = [0]

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @example([("place", 1, 5, False), ("garble", 3, False), ("garble", 4, True),
              ("place", 2, 7, True)])
    @given(OPERATIONS)
    def run(operations: list[tuple[Any, ...]]) -> None:
        if _apply(dsn, store, operations, counter):
            capture_now(shop)
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            reports = runner.run(until_caught_up=True, timeout=120)
            _check(dsn, catalog)
            with psycopg.connect(dsn) as conn:
                unreadable = {int(r[0]) for r in conn.execute(UNREADABLE)}
            for name in ("revenue_by_customer", "placed_with_city"):
                letters = DeadLetters(catalog).find(name, status="open")
                assert unreadable <= {x.position for x in letters}, (name, letters)
                assert all("it is left out of the view" in x.error for x in letters)
        assert {r.name: r.state for r in reports} == {
            "revenue_by_customer": "stopped", "placed_with_city": "stopped"}
        assert all(r.caught_up for r in reports)

    try:
        run()
        # a rebuild replays the events (upcast again) to the same rows
        with Catalog(dsn) as catalog:
            before = sorted(_rows(catalog, "placed_with_city"), key=lambda r: r["position"])
            with Runner(spark, _registry(), config) as runner:
                runner.request_rebuild("placed_with_city")
                runner.run(until_caught_up=True, timeout=120)
            assert catalog.current("placed_with_city").generation == 2
            with psycopg.connect(dsn) as conn:  # the retired generation's feed is gone
                feeds = {r[0] for r in conn.execute(
                    "SELECT name FROM lakefold.changelog_streams WHERE name LIKE "
                    "'lakefold_feeds.placed_with_city%%'")}
            assert feeds == {"lakefold_feeds.placed_with_city_g2_placed"}
            assert sorted(_rows(catalog, "placed_with_city"),
                          key=lambda r: r["position"]) == before
            _check(dsn, catalog)
            # status: the event input's applied position and lag are global positions
            store.wait_for_positions(store.append("order-late", [NewEvent(
                type="order.placed", schema_version=2, data={"customer_id": 1, "amount": 1})]))
            head = store.head()
            (status,) = projection_status(catalog, dsn, ["revenue_by_customer"])
            (events_input,) = status.sources
            assert events_input.source == \
                "placed (events of category order of types order.placed)"
            assert (events_input.head, events_input.lag_records) == (head, 1)
            assert events_input.position == head - 1
    finally:
        store.close()


def test_event_inputs_that_cannot_work_are_refused(spark: Any, shop: CaptureConfig) -> None:
    registry = _event_registry()

    def check(query: str, inputs: dict[str, Any], **kwargs: Any) -> None:
        views = Registry()
        with registering_into(views):
            view("v", inputs=inputs, key="position", query=query,
                 target=delta_table("upsert", keys=["position"]), **kwargs)
        plan_views(spark, views.views, shop.source_dsn)

    placed = {"placed": events("order", types=["order.placed"])}
    with pytest.raises(ProjectionDefinitionError,
                       match=r"order\.lost, which the registry does not know"):
        check("SELECT position FROM placed",
              {"placed": events("order", types=["order.lost"])}, registry=registry)
    # without a registry the payload is JSON text: its fields are not columns
    with pytest.raises(ProjectionDefinitionError, match="amount"):
        check("SELECT position, amount FROM placed", placed)
    check("SELECT position, get_json_object(data, '$.amount') AS amount FROM placed", placed)

    class Clash(BaseModel):
        type: str

    clashing = EventRegistry()
    clashing.add(Clash, name="order.odd")
    with pytest.raises(ProjectionDefinitionError, match="name of an event column"):
        check("SELECT position FROM odd", {"odd": events("order", types=["order.odd"])},
              registry=clashing)
