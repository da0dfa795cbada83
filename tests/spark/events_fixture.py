"""Event models for the Spark source tests, importable by Spark's Python workers (the tests
package is on their path through the working directory)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event("order.placed", version=2)
class OrderPlaced(BaseModel):
    order_id: str
    amount_cents: int
    at: datetime | None = None
    tags: list[str] = []
    extra: dict[str, Any] = {}


@registry.upcaster("order.placed", from_version=1)
def _amount_to_cents(data: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": data["order_id"], "amount_cents": round(data["amount"] * 100)}


@registry.event("order.paid")
class OrderPaid(BaseModel):
    order_id: str
    paid: Decimal
