"""Decoding event payloads (JSON text) into typed Arrow structs, as the events source does in
each Spark task: bulk parsing, upcasting, payload-field selection, multi-line payloads, and the
shredded payload fields of sealed segments (the same result without parsing)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from lakefold.eventstore._segments import shred
from lakefold.spark import SparkLayerError
from lakefold.spark._event_payloads import PayloadDecoder
from tests.spark.events_fixture import registry


def _decode(decoder: PayloadDecoder, rows: list[tuple[str, int, str]],
            shredded: pa.StructArray | None = None) -> list[dict[str, Any]]:
    types, versions, texts = zip(*rows, strict=True)
    decoded = decoder.decode(pa.array(types, pa.string()), pa.array(versions, pa.int32()),
                             pa.array(texts, pa.string()), shredded)
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


def _shredded(rows: list[tuple[str, int, str]]) -> pa.StructArray | None:
    return shred(pa.chunked_array([pa.array([text for _, _, text in rows], pa.string())]))


def test_shredded_fields_are_taken_as_they_are_when_their_types_match():
    rows = [("order.placed", 2, '{"order_id": "a", "amount_cents": 1, "tags": ["x"]}'),
            ("order.paid", 1, '{"order_id": "b", "paid": "1.25"}')]
    shredded = _shredded(rows)
    assert shredded is not None
    assert {f.name: str(f.type) for f in shredded.type} == {
        "order_id": "string", "amount_cents": "int64", "paid": "string"}  # no list
    decoder = PayloadDecoder(registry, None, ["order_id", "amount_cents"])
    # other texts, to see which the decoder used: the shredded fields
    other = [(t, v, '{"order_id": "z", "amount_cents": 9}') for t, v, _ in rows]
    assert _decode(decoder, other, shredded) == [
        {"order_id": "a", "amount_cents": 1}, {"order_id": "b", "amount_cents": None}]
    # a field parsed to another type than the model's (paid: string, not decimal), or rows
    # that need Python (an upcast): the texts are parsed
    paid = PayloadDecoder(registry, ["order.paid"], ["paid"])
    assert _decode(paid, other, shredded) == [{"paid": None}, {"paid": None}]
    old = [("order.placed", 1, '{"order_id": "o", "amount": 2.5}'), rows[1]]
    assert _decode(decoder, old, _shredded(old)) == [
        {"order_id": "o", "amount_cents": 250}, {"order_id": "b", "amount_cents": None}]


_values = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                    st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(st.dictionaries(
    st.sampled_from(["order_id", "amount_cents", "paid", "other"]), _values, max_size=4),
    min_size=1, max_size=8), pretty=st.booleans())
def test_decoding_with_shredded_fields_equals_parsing_the_text(payloads, pretty):
    rows = [("order.placed" if i % 3 else "order.paid", 2 if i % 3 else 1,
             json.dumps(p, indent=2 if pretty else None)) for i, p in enumerate(payloads)]
    decoder = PayloadDecoder(registry, None, ["order_id", "amount_cents"])

    def outcome(shredded: pa.StructArray | None) -> object:
        try:
            return _decode(decoder, rows, shredded)
        except SparkLayerError:
            return "refused"

    assert outcome(_shredded(rows)) == outcome(None)
