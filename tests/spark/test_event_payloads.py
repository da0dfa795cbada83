"""Decoding event payloads (JSON text) into typed Arrow structs, as the events source does in
each Spark task: bulk parsing, upcasting, payload-field selection, multi-line payloads."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from lakefold.spark import SparkLayerError
from lakefold.spark._event_payloads import PayloadDecoder
from tests.spark.events_fixture import registry


def _decode(decoder: PayloadDecoder, rows: list[tuple[str, int, str]]
            ) -> list[dict[str, Any]]:
    types, versions, texts = zip(*rows, strict=True)
    decoded = decoder.decode(pa.array(types, pa.string()), pa.array(versions, pa.int32()),
                             pa.array(texts, pa.string()))
    got: list[dict[str, Any]] = decoded.to_pylist()
    return got


def test_multi_line_payloads_straddling_the_parse_blocks_decode_whole():
    # pretty-printed payloads (newlines as whitespace), more than a 1 MiB parse block in all,
    # so one of them straddles a block boundary
    rows = [("order.placed", 2,
             json.dumps({"order_id": f"o{i}", "amount_cents": i, "tags": ["x" * 40] * 3},
                        indent=2))
            for i in range(8_000)]
    assert sum(len(t) for _, _, t in rows) > 1 << 20
    # without the shapeless `extra` field no payload is rewritten (compacted) in Python
    decoder = PayloadDecoder(registry, ["order.placed"], ["order_id", "amount_cents", "tags"])
    decoded = _decode(decoder, rows)
    assert [d["order_id"] for d in decoded] == [f"o{i}" for i in range(8_000)]
    assert [d["amount_cents"] for d in decoded] == list(range(8_000))
    assert all(d["tags"] == ["x" * 40] * 3 for d in decoded)


def test_selected_payload_fields_only_and_upcast():
    decoder = PayloadDecoder(registry, None, ["amount_cents"])
    assert decoder.struct_type == pa.struct([pa.field("amount_cents", pa.int64())])
    decoded = _decode(decoder, [
        ("order.placed", 2, '{"order_id": "a", "amount_cents": 7, "extra": {"k": 1}}'),
        ("order.placed", 1, '{"order_id": "b", "amount": 1.5}'),  # upcast: 150 cents
        ("order.paid", 1, '{"order_id": "a", "paid": "1.25"}'),  # lacks the field: null
    ])
    assert decoded == [{"amount_cents": 7}, {"amount_cents": 150}, {"amount_cents": None}]


def test_unknown_payload_field_names_the_known_ones():
    with pytest.raises(SparkLayerError, match=r"payload field\(s\) nope; the fields are "
                                              r"order_id, amount_cents"):
        PayloadDecoder(registry, ["order.placed"], ["amount_cents", "nope"])
