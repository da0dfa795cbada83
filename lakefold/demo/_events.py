"""The demo's event time: the shop application appends ``OrderPlaced`` domain events to the
event store next to its tables, and two views read them (``lakefold.demo.projections``):

- ``orders_per_minute``: orders and amount per 1-minute tumbling window of the events'
  ``occurred_at`` (2 minutes of allowed lateness);
- ``orders_with_city``: each order event with its customer's city *as of the event's commit*
  (a ``lookup`` of ``shop.customers``), which a rebuild gives again however the customers
  changed since.

The application records, in each appending transaction, the city it saw there: the oracle the
enriched view must equal. Event times follow the orders three seconds apart, a few of them
out of order by up to a minute (within the lateness); ``late_order`` appends one behind the
newest event time by 90 seconds, which corrects its window.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import psycopg
from pydantic import BaseModel

from lakefold.eventstore import EventStore
from lakefold.schemas import EventRegistry

ORDER_PLACED: Final = "order.placed"
#: Event time of the first order event.
BASE: Final = dt.datetime(2026, 11, 2, 12, 0, tzinfo=dt.UTC)
#: Every how many orders the application appends an event.
EVERY: Final = 10

#: The views as SQL on the source (the oracle of ``orders_per_minute``: no event is later
#: than the allowed lateness, so every one counts in its window).
ORDERS_PER_MINUTE_SQL: Final = (
    "SELECT date_trunc('minute', (data->>'occurred_at')::timestamptz) AS window_start, "
    "count(*) AS orders, sum((data->>'amount')::numeric) AS amount FROM lakefold.events "
    "WHERE category = 'order' AND type = 'order.placed' GROUP BY 1")


class OrderPlaced(BaseModel):
    order_id: int
    customer_id: int
    amount: Decimal
    occurred_at: dt.datetime


def event_types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(OrderPlaced, name=ORDER_PLACED)
    return registry


@dataclass
class OrderEvents:
    """The application's order events: event id → (order id, customer, city it saw)."""

    dsn: str
    seen: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    newest: dt.datetime = BASE

    def append_all(self, *, seed: int = 7) -> int:
        """An event for every ``EVERY``-th order still in the shop; returns how many."""
        rng = random.Random(seed)  # noqa: S311 - a repeatable workload, not secrets
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            orders = conn.execute("SELECT id FROM shop.orders WHERE id %% %s = 0 ORDER BY id",
                                  (EVERY,)).fetchall()
        for index, (order_id,) in enumerate(orders):
            delay = rng.randint(5, 60) if rng.random() < 0.05 else 0
            self.append(int(order_id), BASE + dt.timedelta(seconds=3 * index - delay))
        return len(orders)

    def append(self, order_id: int, occurred_at: dt.datetime) -> None:
        """The application places an order event, in a transaction that reads the order's
        customer and city (what the enriched view must show)."""
        with EventStore(self.dsn, registry=event_types()) as store, \
                store.transaction() as unit:
            row = unit.connection.execute(
                "SELECT o.customer_id, o.amount, c.city FROM shop.orders o JOIN shop.customers c "
                "ON c.id = o.customer_id WHERE o.id = %s", (order_id,)).fetchone()
            assert row is not None  # noqa: S101 - the caller names an existing order
            customer, amount, city = int(row[0]), Decimal(row[1]), str(row[2])
            result = unit.append(f"order-{order_id}-{len(self.seen)}", [OrderPlaced(
                order_id=order_id, customer_id=customer, amount=amount,
                occurred_at=occurred_at)])
        self.seen[str(result.events[0].event_id)] = (order_id, customer, city)
        self.newest = max(self.newest, occurred_at)

    def late_order(self, order_id: int) -> dt.datetime:
        """An order event 90 seconds behind the newest event time (within the lateness):
        it corrects its window. Returns its window's start."""
        at = self.newest - dt.timedelta(seconds=90)
        self.append(order_id, at)
        return at.replace(second=0, microsecond=0)

    def expected_cities(self, conn: psycopg.Connection[Any]) -> dict[int, tuple[int, int, str]]:
        """Global position → (order, customer, city seen) of every event appended."""
        positions = {str(e): int(p) for e, p in conn.execute(
            "SELECT e.event_id, p.first_position + e.ordinal FROM lakefold.events e "
            "JOIN lakefold.event_positions p ON p.xid = e.xid WHERE e.category = 'order'")}
        return {positions[e]: v for e, v in self.seen.items()}
