"""The event registry: registration rules, encoding with validation, upcasting on decode."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from lakefold.schemas import (
    STREAM_DELETED_TYPE,
    EventEnvelope,
    EventMetadata,
    EventRegistry,
    InvalidEventDataError,
    NewEvent,
    StreamDeletedRecord,
    UnknownEventTypeError,
    UpcastError,
    category_of,
    new_event_id,
)


class Placed(BaseModel):
    order_id: str
    amount_cents: int


class Shipped(BaseModel):
    order_id: str


def _registry() -> EventRegistry:
    registry = EventRegistry()
    registry.add(Placed, name="order.placed", version=3)
    registry.add_upcaster("order.placed", from_version=1,
                          upcaster=lambda d: {"order_id": d["id"], "amount": d["amount"]})
    registry.add_upcaster("order.placed", from_version=2, upcaster=lambda d: {
        "order_id": d["order_id"], "amount_cents": round(d["amount"] * 100)})
    return registry


def test_upcasts_through_every_version() -> None:
    registry = _registry()
    assert registry.decode("order.placed", 1, {"id": "o1", "amount": 1.5}) == Placed(
        order_id="o1", amount_cents=150)
    assert registry.decode("order.placed", 2, {"order_id": "o1", "amount": 2}) == Placed(
        order_id="o1", amount_cents=200)
    assert registry.decode("order.placed", 3, {"order_id": "o", "amount_cents": 1}) == Placed(
        order_id="o", amount_cents=1)
    stored = {"id": "o1", "amount": 1.5}
    registry.upcast("order.placed", 1, stored)
    assert stored == {"id": "o1", "amount": 1.5}  # the stored payload is not touched


def test_decode_errors_say_what_to_do() -> None:
    registry = _registry()
    with pytest.raises(UnknownEventTypeError, match="newer than the registered version 3"):
        registry.decode("order.placed", 4, {})
    with pytest.raises(UnknownEventTypeError, match="not registered"):
        registry.decode("order.cancelled", 1, {})
    with pytest.raises(UpcastError, match=r"upcaster from version 1 .* failed: KeyError"):
        registry.decode("order.placed", 1, {"amount": 1})
    with pytest.raises(UpcastError, match="does not validate"):
        registry.decode("order.placed", 2, {"order_id": 7, "amount": 1})
    gap = EventRegistry()
    gap.add(Placed, name="order.placed", version=3)
    gap.add_upcaster("order.placed", from_version=2, upcaster=lambda d: d)
    with pytest.raises(UpcastError, match=r"from_version=1\)"):
        gap.decode("order.placed", 1, {})
    wrong = EventRegistry()
    wrong.add(Shipped, name="order.shipped", version=2)
    wrong.add_upcaster("order.shipped", from_version=1, upcaster=lambda d: [d])  # type: ignore[arg-type,return-value]
    with pytest.raises(UpcastError, match="not a dict"):
        wrong.decode("order.shipped", 1, {})


def test_encode_and_validate_refuse_bad_events() -> None:
    registry = _registry()
    meta = EventMetadata(correlation_id=uuid.uuid4())
    encoded = registry.encode(Placed(order_id="o", amount_cents=5), metadata=meta)
    assert (encoded.type, encoded.schema_version, encoded.data) == (
        "order.placed", 3, {"order_id": "o", "amount_cents": 5})
    assert encoded.metadata is meta
    with pytest.raises(UnknownEventTypeError, match="Shipped is not a registered"):
        registry.encode(Shipped(order_id="o"))
    with pytest.raises(UnknownEventTypeError, match="not a pydantic"):
        registry.encode({"order_id": "o"})  # type: ignore[arg-type]
    with pytest.raises(InvalidEventDataError, match="amount_cents"):
        registry.encode(Placed.model_construct(order_id="o", amount_cents="x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidEventDataError, match="registered at version 3"):
        registry.validate(NewEvent("order.placed", {"order_id": "o", "amount_cents": 1}))
    with pytest.raises(InvalidEventDataError, match="amount_cents"):
        registry.validate(NewEvent("order.placed", {"order_id": "o"}, schema_version=3))
    with pytest.raises(UnknownEventTypeError):
        registry.validate(NewEvent("order.lost", {}))


@pytest.mark.parametrize(("register", "match"), [
    (lambda r: r.add(Placed, name="order.placed", version=4), "already registered"),
    (lambda r: r.add(Placed, name="order.other"), "already registered as"),
    (lambda r: r.add(Shipped, name="$internal"), "reserved"),
    (lambda r: r.add(Shipped, name=" spaced"), "surrounding spaces"),
    (lambda r: r.add(Shipped, name=""), "non-empty"),
    (lambda r: r.add(Shipped, name="order.shipped", version=0), ">= 1"),
    (lambda r: r.add(Shipped, name="order.shipped", version=True), ">= 1"),
    (lambda r: r.add_upcaster("order.placed", from_version=3, upcaster=dict), "beyond"),
    (lambda r: r.add_upcaster("order.placed", from_version=1, upcaster=dict), "exists"),
    (lambda r: r.add_upcaster("order.placed", from_version=0, upcaster=dict), ">= 1"),
])
def test_registration_mistakes_are_refused(register: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        register(_registry())


def test_registration_type_errors_and_decorators() -> None:
    registry = EventRegistry()
    with pytest.raises(TypeError, match="not a pydantic model"):
        registry.add(dict, name="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not callable"):
        registry.add_upcaster("x", from_version=1, upcaster=42)  # type: ignore[arg-type]

    @registry.upcaster("order.shipped", from_version=1)
    def _v2(data: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": data["order"]}

    with pytest.raises(ValueError, match="must be greater than 1"):
        registry.add(Shipped, name="order.shipped", version=1)

    @registry.event("order.shipped", version=2)
    class ShippedV2(BaseModel):
        order_id: str

    assert registry.get("order.shipped").model is ShippedV2
    assert "order.shipped" in registry and registry.names == ["order.shipped"]
    assert registry.decode("order.shipped", 1, {"order": "o"}) == ShippedV2(order_id="o")


def test_deletion_records_decode_without_registration() -> None:
    record = EventRegistry().decode(STREAM_DELETED_TYPE, 1, {
        "stream_id": "order-1", "mode": "hard", "last_version": 4})
    assert record == StreamDeletedRecord(stream_id="order-1", mode="hard", last_version=4)


def test_event_ids_are_time_ordered_uuid7_and_categories() -> None:
    first = new_event_id()
    time.sleep(0.002)
    later = [new_event_id() for _ in range(100)]
    assert first.version == 7 and first.variant == uuid.RFC_4122
    assert all(first < other for other in later)
    assert len(set(later)) == 100
    assert abs((first.int >> 80) - time.time() * 1000) < 5_000
    assert category_of("order-42") == "order" and category_of("order-7-a") == "order"
    assert category_of("singleton") == "singleton"


def test_metadata_causation_chain() -> None:
    cause = EventEnvelope(event_id=uuid.uuid4(), stream_id="order-1", stream_version=1,
                          position=1, type="order.placed", schema_version=1, data_json="{}",
                          metadata=EventMetadata(), recorded_at=None)  # type: ignore[arg-type]
    effect = EventMetadata(extra={"by": "saga"}).caused_by(cause)
    assert effect.correlation_id == cause.event_id and effect.causation_id == cause.event_id
    next_effect = EventMetadata().caused_by(EventEnvelope(
        event_id=uuid.uuid4(), stream_id="x-1", stream_version=1, position=2, type="t",
        schema_version=1, data_json="{}", metadata=effect, recorded_at=None))  # type: ignore[arg-type]
    assert next_effect.correlation_id == cause.event_id and effect.extra == {"by": "saga"}
    assert cause.category == "order" and not cause.is_deletion
