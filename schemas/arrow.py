"""Arrow and Spark schemas for lakefold's data: pydantic event models and captured columns.

- ``arrow_schema_for_model(Model)``: the Arrow struct fields of a pydantic model's JSON form
  (what ``model.model_dump(mode="json")`` produces, typed): ints, floats, strings, bools,
  decimals, dates, datetimes, UUIDs and enums, optional fields, nested models as structs, lists.
  Types without a fixed shape (``dict``, ``Any``, unions of different types) become JSON text.
- ``payload_schema(models)``: one struct type covering several event models (the union of
  their fields), or an error when two models give one field different types.
- ``spark_compatible(schema)``: the schema with the types Spark or Delta cannot hold (time of
  day, intervals) replaced by strings; ``conform_batch`` applies it to data.
- ``spark_schema(schema)``: the Spark ``StructType`` (PySpark is imported only here).

No I/O; pure functions of types.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from lakefold.schemas.exceptions import SchemaTerminalError

JSON_TEXT = pa.string()
_DECIMAL_DEFAULT = pa.decimal128(38, 9)

_SCALARS: dict[type, pa.DataType] = {
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bytes: pa.string(),  # pydantic's JSON form of bytes is text
    dt.datetime: pa.timestamp("us", tz="UTC"),
    dt.date: pa.date32(),
    uuid.UUID: pa.string(),
    decimal.Decimal: _DECIMAL_DEFAULT,
}


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def arrow_type_for(annotation: Any) -> pa.DataType:
    """The Arrow type of a value annotated ``annotation``, in its JSON form."""
    annotation, _ = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return arrow_type_for(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        kinds = {type(v) for v in typing.get_args(annotation)}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            return _SCALARS[next(iter(kinds))]
        return JSON_TEXT
    if origin in (list, tuple, set, frozenset, Sequence, Iterable):
        args = typing.get_args(annotation)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return JSON_TEXT  # fixed-shape tuples have mixed types
        return pa.list_(arrow_type_for(args[0]) if args else JSON_TEXT)
    if origin is not None:
        return JSON_TEXT  # dict, Mapping, unions of several types
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return pa.struct(list(arrow_schema_for_model(annotation)))
        if issubclass(annotation, enum.Enum):
            member_types = {type(m.value) for m in annotation}
            if len(member_types) == 1:
                return _SCALARS.get(next(iter(member_types)), JSON_TEXT)
            return JSON_TEXT
        for python_type, arrow in _SCALARS.items():
            if issubclass(annotation, python_type):
                # datetime is a date subclass: checked first by the table's order
                return arrow
    return JSON_TEXT


def arrow_schema_for_model(model: type[BaseModel]) -> pa.Schema:
    """The Arrow schema of ``model``'s JSON form, one nullable field per model field (by its
    serialization alias when it has one)."""
    fields = []
    for name, info in model.model_fields.items():
        column = info.serialization_alias or info.alias or name
        fields.append(pa.field(column, arrow_type_for(info.annotation)))
    return pa.schema(fields)


def payload_schema(models: Mapping[str, type[BaseModel]]) -> pa.Schema:
    """One schema holding the payloads of several event types: the union of their fields.

    Raises SchemaError when two types give one field name different Arrow types.
    """
    merged: dict[str, pa.Field] = {}
    owner: dict[str, str] = {}
    for type_name, model in models.items():
        for field in arrow_schema_for_model(model):
            known = merged.get(field.name)
            if known is None:
                merged[field.name] = field
                owner[field.name] = type_name
            elif known.type != field.type:
                raise SchemaTerminalError(
                    f"field {field.name!r} is {known.type} in {owner[field.name]!r} but "
                    f"{field.type} in {type_name!r}; read these event types with separate "
                    "sources"
                )
    return pa.schema(list(merged.values()))


def _compatible_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_time(arrow_type) or pa.types.is_interval(arrow_type):
        return pa.string()
    if pa.types.is_large_string(arrow_type):
        return pa.string()
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.list_(_compatible_type(arrow_type.value_type))
    if pa.types.is_struct(arrow_type):
        return pa.struct([pa.field(f.name, _compatible_type(f.type)) for f in arrow_type])
    return arrow_type


def spark_compatible(schema: pa.Schema) -> pa.Schema:
    """``schema`` with time-of-day and interval types as strings: Delta has neither type, and
    Spark has no Arrow conversion for intervals."""
    return pa.schema([pa.field(f.name, _compatible_type(f.type)) for f in schema])


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.time):
        return value.isoformat()
    if isinstance(value, tuple) and len(value) == 3:  # month_day_nano as_py() in old pyarrow
        months, days, nanos = value
        return f"P{months}M{days}DT{nanos / 1e9:g}S"
    if hasattr(value, "months") and hasattr(value, "days") and hasattr(value, "nanoseconds"):
        return f"P{value.months}M{value.days}DT{value.nanoseconds / 1e9:g}S"
    return json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)


def _conform_array(array: pa.Array | pa.ChunkedArray, wanted: pa.DataType) -> pa.Array:
    if array.type == wanted:
        return array
    try:
        return pc.cast(array, wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if pa.types.is_string(wanted):
            return pa.array([_as_text(v) for v in array.to_pylist()], type=wanted)
        raise


def _missing_column(field: pa.Field, rows: int) -> pa.Array:
    """A column the batch lacks: nulls, or zero values where nulls are not allowed (a column
    the reader did not fetch because nothing reads it; Spark refuses nulls in a non-nullable
    column)."""
    column = pa.nulls(rows, field.type)
    if field.nullable:
        return column
    if pa.types.is_string(field.type):
        return column.fill_null("")
    if pa.types.is_boolean(field.type):
        return column.fill_null(False)
    return column.fill_null(pa.scalar(0, pa.int64()).cast(field.type))


def conform_batch(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns: by name, cast, missing ones as nulls (zero
    values in a non-nullable field), extra ones dropped (a column added to the source after
    the reader's schema was fixed). Every Spark source of lakefold hands its batches out
    through here."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(_missing_column(field, batch.num_rows))
        else:
            columns.append(_conform_array(batch.column(index), field.type))
    if isinstance(batch, pa.Table):
        columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def spark_schema(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema (after ``spark_compatible``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spark_compatible(schema), prefer_timestamp_ntz=True)
