"""Typed event payloads for Spark: JSON text in the store, a struct column in the DataFrame.

``PayloadDecoder`` turns the ``data`` JSON text of a batch of events into one Arrow struct
column typed by the registered pydantic models (``lakefold.schemas.arrow.payload_schema``).
Payloads stored at the current version of their type are parsed in bulk by Arrow's JSON reader;
payloads stored at an older version are first brought to the current version by the registry's
upcasters (row by row, only those rows). Fields whose model type has no fixed shape (``dict``,
``Any``) arrive as JSON text.

The registry is named by an import path (``"myapp.events:registry"``), because Spark's Python
workers build the source from string options: the module must be importable there.
"""

from __future__ import annotations

import importlib
import json
import typing
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel

from lakefold.schemas import EventRegistry
from lakefold.schemas.arrow import JSON_TEXT, arrow_type_for, payload_schema, spark_compatible
from lakefold.schemas.exceptions import SchemaError
from lakefold.schemas.json_payloads import parse_payloads
from lakefold.spark.exceptions import SparkTerminalError


def load_registry(path: str) -> EventRegistry:
    """The EventRegistry at ``"module:attribute"`` (an instance, or a function returning one)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise SparkTerminalError(
            f"registry {path!r} is not an import path; use 'package.module:registry'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SparkTerminalError(
            f"cannot import {module_name!r} for the event registry: {e}; it must be installed "
            "(or on PYTHONPATH) where Spark's Python workers run"
        ) from e
    value = getattr(module, attribute, None)
    if callable(value) and not isinstance(value, EventRegistry):
        value = value()
    if not isinstance(value, EventRegistry):
        raise SparkTerminalError(f"{path} is not an EventRegistry (got {type(value).__name__})")
    return value


def _json_text_fields(model: type[BaseModel]) -> set[str]:
    """Top-level fields whose values are kept as JSON text (no fixed shape)."""
    out = set()
    for name, info in model.model_fields.items():
        column = info.serialization_alias or info.alias or name
        if arrow_type_for(info.annotation) == JSON_TEXT and info.annotation is not str:
            annotation = info.annotation
            if annotation is not None and not (
                isinstance(annotation, type) and issubclass(annotation, str)
            ):
                out.add(column)
    return out


def _required_fields(model: type[BaseModel]) -> dict[str, bool]:
    """The model's required top-level fields (by the column they are read from) → whether
    the field may hold null (a required ``x: int | None`` must be present, but may be null)."""
    out = {}
    for name, info in model.model_fields.items():
        if info.is_required():
            column = info.serialization_alias or info.alias or name
            out[column] = type(None) in typing.get_args(info.annotation)
    return out


class PayloadDecoder:
    """Decodes ``data`` JSON text of the selected event types into a typed struct column."""

    def __init__(self, registry: EventRegistry, types: Sequence[str] | None,
                 fields: Sequence[str] | None = None) -> None:
        names = list(types) if types else registry.names
        if not names:
            raise SparkTerminalError("the event registry has no event types registered")
        try:
            self.models = {name: registry.get(name).model for name in names}
            self.versions = {name: registry.get(name).version for name in names}
            schema = spark_compatible(payload_schema(self.models))
        except (SchemaError, LookupError) as e:
            raise SparkTerminalError(f"cannot type the event payloads: {e}") from e
        if fields:
            unknown = sorted(set(fields) - set(schema.names))
            if unknown:
                raise SparkTerminalError(
                    f"no selected event type has payload field(s) {', '.join(unknown)}; the "
                    f"fields are {', '.join(schema.names)}")
            schema = pa.schema([f for f in schema if f.name in set(fields)])
        self.schema = schema
        self.registry = registry
        # only the selected shapeless fields need a payload rewritten in Python
        self.text_fields = {name: _json_text_fields(m) & set(schema.names)
                            for name, m in self.models.items()}
        self.struct_type = pa.struct(list(self.schema))
        self.required = {name: {f: nullable for f, nullable in _required_fields(m).items()
                                if f in schema.names}
                         for name, m in self.models.items()}

    def _rewrite(self, type_name: str, version: int, text: str) -> str:
        """The payload brought to the current version, with shapeless fields as JSON text."""
        data: Any = json.loads(text)
        if type_name in self.models and version != self.versions[type_name]:
            data = self.registry.upcast(type_name, version, data)
        for name in self.text_fields.get(type_name, ()):
            if name in data and data[name] is not None and not isinstance(data[name], str):
                data[name] = json.dumps(data[name], separators=(",", ":"))
        return json.dumps(data, separators=(",", ":"))

    def _rewritten_rows(self, types: pa.Array, versions: pa.Array) -> pa.Array:
        """Indices of the rows whose payload goes through Python: stored at an older version of
        a registered type (upcast), or of a type with shapeless fields (kept as JSON text)."""
        mask = pa.nulls(len(types), pa.bool_()).fill_null(False)
        for name, version in self.versions.items():
            rows = pc.equal(types, name)
            if not self.text_fields[name]:
                rows = pc.and_(rows, pc.not_equal(versions, version))
            mask = pc.or_(mask, rows.fill_null(False))
        return pc.indices_nonzero(mask)

    def _from_shredded(self, shredded: pa.StructArray) -> pa.StructArray | None:
        """The struct from a segment's shredded payload fields, if it has every field of the
        schema with the very type the JSON reader gives it (then the values are the same)."""
        kinds = {field.name: field.type for field in shredded.type}
        if any(kinds.get(field.name) != field.type for field in self.schema):
            return None
        columns = [pc.struct_field(shredded, [shredded.type.get_field_index(field.name)])
                   for field in self.schema]
        return pa.StructArray.from_arrays(columns, fields=list(self.schema))

    def decode(self, types: pa.Array, versions: pa.Array, data: pa.Array,
               shredded: pa.StructArray | None = None) -> pa.StructArray:
        """One struct per event; fields a type lacks are null. Payloads at their type's current
        version never become Python objects: Arrow's JSON reader parses them in bulk, or they
        come already parsed from a sealed segment (``shredded``)."""
        if len(data) == 0:
            return pa.array([], type=self.struct_type)
        rewritten = self._rewritten_rows(types, versions).to_pylist()
        if shredded is not None and not rewritten:
            typed = self._from_shredded(shredded)
            if typed is not None:
                return typed
        if rewritten:
            texts: list[str] = data.to_pylist()
            type_list = types.to_pylist()
            version_list = versions.to_pylist()
            for i in rewritten:
                texts[i] = self._rewrite(type_list[i], version_list[i], texts[i])
            data = pa.array(texts, pa.string())
        try:
            table = parse_payloads(data, self.schema)
        except pa.ArrowInvalid as e:
            raise SparkTerminalError(
                f"event payloads do not fit the registered models' fields: {e}") from e
        columns = [table.column(f.name).combine_chunks() for f in self.schema]
        return pa.StructArray.from_arrays(columns, fields=list(self.schema))

    def check_required(self, types: pa.Array, decoded: pa.StructArray, data: pa.Array) -> None:
        """Raise SparkTerminalError, naming the field, when an event's payload lacks a field
        its model requires (absent, or null where the model does not allow null): the model
        cannot read it, so it is not an event of that type as registered."""
        for name, fields in self.required.items():
            if not fields:
                continue
            of_type = pc.equal(types, name).fill_null(False)
            for field, nullable in fields.items():
                values = decoded.field(self.schema.get_field_index(field))
                bad = pc.indices_nonzero(pc.and_(of_type, pc.is_null(values))).to_pylist()
                for index in bad:
                    if nullable and field in json.loads(data[index].as_py() or "{}"):
                        continue  # present, and null is allowed
                    raise SparkTerminalError(
                        f"event payload of type {name} has no value for its required field "
                        f"{field!r}")
