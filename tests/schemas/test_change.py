"""The change event model: operations, validation, JSON round trip."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from pydantic import ValidationError

from lakefold.schemas import ChangeEvent, ChangeSource, Operation


def event(**overrides: object) -> ChangeEvent:
    values: dict[str, object] = {
        "source": {"database": "shop", "schema": "public", "table": "orders"},
        "operation": "update", "key": {"id": 1}, "before": None,
        "after": {"id": 1, "amount": Decimal("9.50"), "blob": b"\x00\xff"},
        "commit_lsn": 0x1_0000_00A0, "ordinal": 3, "xid": 777,
        "commit_ts": datetime(2024, 1, 2, tzinfo=UTC), "schema_version": 2, "position": 41,
    }
    values.update(overrides)
    return ChangeEvent.model_validate(values)


def test_operations_and_their_stored_codes() -> None:
    assert [op.code for op in Operation] == ["i", "u", "d", "t", "r"]
    assert all(Operation.from_code(op.code) is op for op in Operation)
    with pytest.raises(ValueError, match="unknown operation code 'x'"):
        Operation.from_code("x")


def test_event_fields_and_json_round_trip() -> None:
    e = event()
    assert e.source == ChangeSource(database="shop", schema_name="public", table="orders")
    assert e.commit_lsn_text == "1/A0"
    assert e.dedupe_key == (0x1_0000_00A0, 3)
    dumped = e.model_dump_json()
    assert '"schema":"public"' in dumped and '"blob":"AP8="' in dumped
    again = ChangeEvent.model_validate_json(dumped)
    assert again.source == e.source and again.operation is Operation.UPDATE
    assert again.after is not None and again.after["amount"] == "9.50"  # JSON has no Decimal
    with pytest.raises(ValidationError):
        e.ordinal = 4  # type: ignore[misc]


@pytest.mark.parametrize("bad", [{"ordinal": 0}, {"operation": "upsert"}, {"commit_lsn": -1},
                                 {"schema_version": 0}, {"position": 0}])
def test_invalid_events_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        event(**bad)
