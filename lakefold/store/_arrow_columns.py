"""Text columns of a changelog read turned into typed Arrow columns, vectorised where Arrow can.

Arrow types per column kind:

==============  ==========================================================================
int2/4/8        int16 / int32 / int64
numeric(p, s)   decimal128(p, s) when p <= 38; unconstrained numeric: string (exact text)
float4/8        float32 / float64
text, enum,     string
uuid, json,
jsonb, other
bool            bool
date            date32
time            time64[us]
timestamp       timestamp[us]
timestamptz     timestamp[us, UTC]
interval        month_day_nano_interval
bytea           binary
array           list<element type> (multi-dimensional arrays are flattened in row-major
                order; ``read_events`` keeps their nesting)
==============  ==========================================================================

A value the Arrow type cannot hold (``NaN`` in a ``numeric(p, s)``, ``infinity`` or BC dates
and timestamps, ``24:00:00``) becomes null in the typed column; ``read_events`` returns it
exactly, as text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from lakefold.store._stream_schema import ColumnSchema
from lakefold.store._text_values import BOOL_TEXT, Interval, converter_for
from lakefold.store.exceptions import CaptureValueError

_SIMPLE: Final[dict[str, pa.DataType]] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "text": pa.string(),
    "enum": pa.string(),
    "uuid": pa.string(),
    "json": pa.string(),
    "jsonb": pa.string(),
    "other": pa.string(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "interval": pa.month_day_nano_interval(),
    "bytea": pa.binary(),
}
# Kinds Arrow's cast kernel parses from PostgreSQL's text output.
_CASTABLE: Final = frozenset({"int2", "int4", "int8", "float4", "float8", "date", "timestamp",
                              "timestamptz", "numeric"})


def _scalar_type(kind: str, column: ColumnSchema) -> pa.DataType:
    if kind == "numeric":
        ps = column.numeric_precision_scale
        if ps is not None and 0 < ps[0] <= 38 and 0 <= ps[1] <= ps[0]:
            return pa.decimal128(ps[0], ps[1])
        return pa.string()
    return _SIMPLE[kind]


def arrow_type(column: ColumnSchema) -> pa.DataType:
    """The Arrow type of ``column``'s values in typed reads."""
    if column.kind == "array":
        return pa.list_(_scalar_type(column.element_kind or "other", column))
    return _scalar_type(column.kind, column)


def _to_arrow_scalar(kind: str) -> Callable[[Any], Any]:
    """Python value (from ``_text_values``) -> something ``pa.array`` accepts for the Arrow type;
    values the type cannot hold become None."""
    if kind == "interval":
        def interval(value: Any) -> Any:
            if not isinstance(value, Interval):
                return None
            return pa.scalar((value.months, value.days, value.microseconds * 1000),
                             type=pa.month_day_nano_interval()).as_py()
        return interval
    if kind in ("date", "time", "timestamp", "timestamptz"):
        return lambda value: None if isinstance(value, str) else value
    if kind == "numeric":
        return lambda value: value if value.is_finite() else None
    return lambda value: value


def _identity(value: Any) -> Any:
    return value


def _flatten(items: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, list):
            flat.extend(_flatten(item))
        else:
            flat.append(item)
    return flat


def _python_path(column: ColumnSchema, texts: pa.Array, target: pa.DataType) -> pa.Array:
    values = texts.to_pylist()
    if column.kind == "array":
        element_kind = column.element_kind or "other"
        keep_text = target.value_type == pa.string()
        convert: Callable[[str], Any] = _identity if keep_text else converter_for(element_kind)
        scalar: Callable[[Any], Any] = _identity if keep_text else _to_arrow_scalar(element_kind)
        from lakefold.store._text_values import parse_array

        out: list[Any] = []
        for text in values:
            if text is None:
                out.append(None)
                continue
            flat = _flatten(parse_array(text))
            out.append([None if item is None else scalar(convert(item)) for item in flat])
        return pa.array(out, type=target)
    convert = converter_for(column.kind)
    scalar = _to_arrow_scalar(column.kind)
    return pa.array([None if text is None else scalar(convert(text)) for text in values],
                    type=target)


def _bool_array(texts: pa.Array) -> pa.Array:
    """Booleans from their text (``_text_values.BOOL_TEXT``); other text is refused."""
    known = pc.is_in(texts, value_set=pa.array(list(BOOL_TEXT)))
    if not pc.all(pc.or_kleene(known, pc.is_null(texts))).as_py():
        bad = pc.filter(texts, pc.invert(pc.fill_null(known, True)))[0].as_py()
        raise CaptureValueError(f"{bad!r} is not a boolean's text (t or f)")
    true = pc.is_in(texts, value_set=pa.array(["t", "true"]))
    return pc.if_else(pc.is_null(texts), pa.scalar(None, pa.bool_()), true)


def typed_array(column: ColumnSchema, texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Convert a string array of ``column``'s text values to its Arrow type."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    target = arrow_type(column)
    kind = column.kind
    if target == pa.string():
        return texts
    if kind == "bool":
        return _bool_array(texts)
    if kind in _CASTABLE:
        try:
            return pc.cast(texts, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a special value somewhere (NaN, infinity, BC): convert value by value
    return _python_path(column, texts, target)


def empty_typed_table(columns: tuple[ColumnSchema, ...], meta: pa.Schema) -> pa.Table:
    """A table with no rows and the schema a typed read of ``columns`` would have."""
    fields = list(meta) + [pa.field(c.name, arrow_type(c)) for c in columns]
    return pa.schema(fields).empty_table()
