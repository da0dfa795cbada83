"""Schema planning for a Delta write: which columns a batch may bring, and how they are typed.

A batch may add columns (schema evolution; they become nullable columns of the table) and may
carry narrower integer or float types than the table, which are widened. Anything else, a column
whose type changes or a partitioning that differs from the table's, cannot be merged: the
planner raises ``SchemaMergeError`` before anything is written or committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import Field as DeltaField, Schema as DeltaSchema
from deltalake.schema import PrimitiveType

from lakefold.spark._delta_files import SUPPORTED_PARTITION_TYPES, is_partitionable
from lakefold.spark._delta_target import DeltaTarget, WriteMode
from lakefold.spark.exceptions import SchemaMergeError, SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

# Lossless widenings a batch may need against the table (Spark sums and counts are often long
# while a first batch was int). Keys: (batch type, table type).
_WIDENINGS = {
    ("byte", "short"), ("byte", "integer"), ("byte", "long"),
    ("short", "integer"), ("short", "long"), ("integer", "long"),
    ("float", "double"),
}


@dataclass(frozen=True)
class WritePlan:
    """The schema a batch is written with.

    ``table_schema`` is the table's schema after this write (existing columns plus
    ``new_columns``); ``file_schema`` is what the tasks write (the batch's columns in the
    table's types, plus the tombstone flag for staged merges).
    """

    table_schema: pa.Schema
    file_schema: pa.Schema
    new_columns: tuple[DeltaField, ...]
    data_columns: tuple[str, ...]


def arrow_schema_of(spark_schema: StructType) -> pa.Schema:
    """The Arrow schema Spark hands to ``mapInArrow`` for rows of ``spark_schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(spark_schema, timezone="UTC")
    except TypeError as e:  # pyspark raises TypeError-derived errors for unsupported types
        raise SparkTerminalError(
            f"the batch has a column type Delta cannot store: {e}; cast it first"
        ) from e


def _type_name(field: DeltaField) -> str:
    """"long", "string", ... for primitive types; the full repr for nested ones."""
    kind = field.type
    return str(kind.type) if isinstance(kind, PrimitiveType) else repr(kind)


def _delta_fields(schema: pa.Schema) -> list[DeltaField]:
    try:
        delta = DeltaSchema.from_arrow(schema)
    except Exception as e:  # delta-rs raises plain exceptions for unconvertible types
        raise SparkTerminalError(f"the batch schema cannot be stored in Delta: {e}") from e
    return [DeltaField(f.name, f.type, nullable=True) for f in delta.fields]


def _check_columns(target: DeltaTarget, batch: pa.Schema) -> None:
    names = set(batch.names)
    if len(names) != len(batch.names):
        raise SparkTerminalError(f"the batch has duplicate column names: {batch.names}")
    needed = [*target.keys, *target.partition_by]
    if target.order_by:
        needed.append(target.order_by)
    if target.deleted_column:
        needed.append(target.deleted_column)
    missing = [name for name in needed if name not in names]
    if missing:
        raise SparkTerminalError(
            f"the batch lacks column(s) {', '.join(missing)} named by the target for "
            f"{target.path}; its columns are {', '.join(batch.names)}"
        )
    if target.deleted_column and not pa.types.is_boolean(batch.field(target.deleted_column).type):
        raise SparkTerminalError(
            f"deleted_column {target.deleted_column!r} must be boolean, "
            f"not {batch.field(target.deleted_column).type}"
        )
    for name in target.partition_by:
        if not is_partitionable(batch.field(name).type):
            raise SparkTerminalError(
                f"cannot partition by {name!r} of type {batch.field(name).type}; "
                f"partition columns must be {SUPPORTED_PARTITION_TYPES}"
            )


def plan_write(target: DeltaTarget, batch: pa.Schema, table: DeltaSchema | None,
               table_partitions: Sequence[str] | None) -> WritePlan:
    """Check the batch against the table and return the write schema, or raise.

    Raises SchemaMergeError for a type change of an existing column, a new column whose name
    differs from an existing one only by case, or a partitioning that differs from the table's.
    """
    _check_columns(target, batch)
    if table_partitions is not None and tuple(table_partitions) != target.partition_by:
        raise SchemaMergeError(
            f"{target.path} is partitioned by {list(table_partitions) or 'nothing'}, but the "
            f"target says {list(target.partition_by) or 'nothing'}; use the table's "
            "partitioning, or write a new generation"
        )
    flag = target.deleted_column
    batch_data = pa.schema([f for f in batch if f.name != flag])
    if target.mode is WriteMode.DELETE:
        batch_data = pa.schema([batch_data.field(k) for k in target.keys])
    incoming = _delta_fields(batch_data)
    existing = {f.name: f for f in table.fields} if table is not None else {}
    lowered = {name.lower(): name for name in existing}
    problems: list[str] = []
    new_columns: list[DeltaField] = []
    file_fields: list[DeltaField] = []
    for field in incoming:
        current = existing.get(field.name)
        if current is None:
            clash = lowered.get(field.name.lower())
            if clash is not None:
                problems.append(f"new column {field.name!r} differs from {clash!r} only by case")
                continue
            if target.mode is WriteMode.DELETE:
                problems.append(f"key column {field.name!r} is not in the table")
                continue
            new_columns.append(field)
            file_fields.append(field)
            continue
        have, want = _type_name(field), _type_name(current)
        if have != want and (have, want) not in _WIDENINGS:
            problems.append(f"column {field.name!r} is {want} in the table but {have} in the batch")
            continue
        file_fields.append(current)
    if problems:
        raise SchemaMergeError(
            f"cannot merge the batch schema into {target.path}: {'; '.join(problems)}. "
            "Nothing was written; cast the batch to the table's types, or rebuild into a new "
            "generation"
        )
    table_fields = [*(table.fields if table is not None else []), *new_columns]
    table_schema = pa.schema(DeltaSchema(table_fields).to_arrow())
    file_schema = pa.schema(DeltaSchema(file_fields).to_arrow()) if file_fields else pa.schema([])
    if flag is not None:
        file_schema = file_schema.append(pa.field(flag, pa.bool_()))
    if target.mode in (WriteMode.APPEND, WriteMode.OVERWRITE):
        # Data files carry every table column; columns missing from the batch are null.
        file_schema = table_schema
    return WritePlan(
        table_schema=table_schema,
        file_schema=file_schema,
        new_columns=tuple(new_columns),
        data_columns=tuple(f.name for f in file_fields),
    )
