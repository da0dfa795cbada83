"""Task side of a Delta write: Spark tasks write Parquet files and describe them for the commit.

``write_task_files`` runs inside Spark's Python workers (through ``DataFrame.mapInArrow``). It
writes each task's rows as Parquet, one file per partition value, into the table directory (or a
staging directory), and yields one row per file: path relative to the table root, size, row
count, partition values and Delta column statistics. Nothing here touches the Delta log; the
driver commits the files in one transaction (``_delta_commit``).

Files follow Delta's layout: partition columns are not stored in the files but in Hive-style
directories (``region=eu/``) and in the log's ``partitionValues``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakefold.core.object_store import filesystem_for

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Delta writers truncate string statistics; a prefix is still a valid lower bound.
_STATS_STRING_LIMIT = 32
# Characters Hive/Spark escape in partition directory names (ExternalCatalogUtils), plus the
# space, which delta-rs escapes too. Readers unescape every %XX.
_HIVE_ESCAPE = set('"#%\'*/:=?\\\x7f{[]^ ')

# The Spark schema of the rows write_task_files yields (one per file).
FILE_ROW_DDL = (
    "path STRING, size LONG, num_records LONG, partition_values STRING, stats STRING, "
    "modification_time LONG"
)
FILE_ROW_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("num_records", pa.int64()),
        ("partition_values", pa.string()),
        ("stats", pa.string()),
        ("modification_time", pa.int64()),
    ]
)


@dataclass(frozen=True)
class FileWriteSpec:
    """Everything a task needs to write its files; pickled to the workers.

    ``schema`` is the full write schema (partition columns included); ``prefix`` is a directory
    under the table root ("" for data files, a staging directory for merges).
    """

    table_uri: str
    prefix: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    compression: str = "snappy"
    #: The object store's options for an ``s3://`` table (workers never see the driver's
    #: registry); None for a local table.
    storage_options: dict[str, str] | None = None


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file written by a task, as the driver sees it."""

    path: str  # relative to the table root, as on disk (delta-rs URL-encodes it in the log)
    size: int
    num_records: int
    partition_values: dict[str, str | None]
    stats: str
    modification_time: int


def escape_path_name(value: str) -> str:
    """Escape a partition value for a directory name the way Hive and Spark do."""
    out = []
    for ch in value:
        if ch in _HIVE_ESCAPE or ord(ch) < 0x20:
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out)


def partition_value_string(value: Any) -> str | None:
    """Delta's string form of a partition value (protocol: "Partition Value Serialization")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


SUPPORTED_PARTITION_TYPES = "string, integer, boolean, date"


def is_partitionable(arrow_type: pa.DataType) -> bool:
    """Types lakefold accepts as partition columns (exact, readable by every Delta reader)."""
    return bool(
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_integer(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_date32(arrow_type)
    )


def _stats_value(value: Any) -> Any:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    return value


class _ColumnStats:
    """Running min/max/null count of one column, for the types where min/max are exact."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.with_bounds = bool(
            pa.types.is_integer(arrow_type)
            or pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type)
            or pa.types.is_date32(arrow_type)
        )
        self.is_string = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
        self.nulls = 0
        self.min: Any = None
        self.max: Any = None

    def add(self, column: pa.ChunkedArray | pa.Array) -> None:
        self.nulls += column.null_count
        if not self.with_bounds or column.null_count == len(column):
            return
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        self.min = low if self.min is None or low < self.min else self.min
        self.max = high if self.max is None or high > self.max else self.max

    def bounds(self) -> tuple[Any, Any]:
        """(min, max) for the log; None where no exact bound can be given."""
        low, high = self.min, self.max
        if self.is_string:
            if low is not None and len(low) > _STATS_STRING_LIMIT:
                low = low[:_STATS_STRING_LIMIT]
            if high is not None and len(high) > _STATS_STRING_LIMIT:
                high = None  # a truncated max would be below the real one
        return _stats_value(low), _stats_value(high)


class _FileBuilder:
    """One open Parquet file of one partition value in one task."""

    def __init__(self, spec: FileWriteSpec, fs: pafs.FileSystem, root: str,
                 partition_values: dict[str, str | None], data_schema: pa.Schema) -> None:
        directory = "/".join(
            f"{escape_path_name(name)}="
            f"{HIVE_NULL if value is None else escape_path_name(value)}"
            for name, value in partition_values.items()
        )
        name = f"part-{uuid.uuid4()}.c000.{spec.compression}.parquet"
        relative = "/".join(part for part in (spec.prefix, directory, name) if part)
        self.relative = relative
        self.full_path = f"{root}/{relative}"
        fs.create_dir(self.full_path.rsplit("/", 1)[0], recursive=True)
        self.partition_values = partition_values
        self.stats = {f.name: _ColumnStats(f.type) for f in data_schema}
        self.rows = 0
        self.fs = fs
        self.writer = pq.ParquetWriter(
            self.full_path, data_schema, filesystem=fs, compression=spec.compression
        )

    def add(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows
        for name, column_stats in self.stats.items():
            column_stats.add(table.column(name))

    def close(self) -> WrittenFile:
        self.writer.close()
        info = self.fs.get_file_info(self.full_path)
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for name, column_stats in self.stats.items():
            low, high = column_stats.bounds()
            if low is not None:
                mins[name] = low
            if high is not None:
                maxs[name] = high
        stats = {
            "numRecords": self.rows,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": {name: s.nulls for name, s in self.stats.items()},
        }
        mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
        return WrittenFile(
            path=self.relative,
            size=int(info.size or 0),
            num_records=self.rows,
            partition_values=self.partition_values,
            stats=json.dumps(stats, separators=(",", ":")),
            modification_time=int(mtime),
        )


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """The batch with the write schema's columns, order and types (missing columns as nulls)."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _split_by_partition(table: pa.Table, partition_by: tuple[str, ...]
                        ) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    if not partition_by:
        yield {}, table
        return
    groups = table.select(list(partition_by)).group_by(list(partition_by), use_threads=False)
    keys = groups.aggregate([])
    for row in keys.to_pylist():
        mask = None
        for name in partition_by:
            column = table.column(name)
            value = row[name]
            cond = pc.is_null(column) if value is None else pc.equal(column, value)
            cond = pc.fill_null(cond, False)
            mask = cond if mask is None else pc.and_(mask, cond)
        values = {name: partition_value_string(row[name]) for name in partition_by}
        yield values, table.filter(mask)


def write_task_files(spec: FileWriteSpec, batches: Iterator[pa.RecordBatch]
                     ) -> Iterator[pa.RecordBatch]:
    """Write one task's rows as Parquet files; yield one FILE_ROW_SCHEMA row per file.

    Guarantees: a file is complete (closed) before it is reported; a task with no rows writes
    no file; each file holds rows of exactly one partition value.
    """
    fs, root = filesystem_for(spec.table_uri, spec.storage_options)
    data_schema = pa.schema([f for f in spec.schema if f.name not in spec.partition_by])
    builders: dict[tuple[str | None, ...], _FileBuilder] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        table = _conform(batch, spec.schema)
        for values, part in _split_by_partition(table, spec.partition_by):
            key = tuple(values.values())
            builder = builders.get(key)
            if builder is None:
                builder = _FileBuilder(spec, fs, root, values, data_schema)
                builders[key] = builder
            builder.add(part.drop_columns(list(spec.partition_by)))
    files = [builder.close() for builder in builders.values()]
    if files:
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "path": f.path,
                    "size": f.size,
                    "num_records": f.num_records,
                    "partition_values": json.dumps(f.partition_values),
                    "stats": f.stats,
                    "modification_time": f.modification_time,
                }
                for f in files
            ],
            schema=FILE_ROW_SCHEMA,
        )


def file_from_row(row: dict[str, Any]) -> WrittenFile:
    """The driver's view of one FILE_ROW_SCHEMA row."""
    return WrittenFile(
        path=str(row["path"]),
        size=int(row["size"]),
        num_records=int(row["num_records"]),
        partition_values=json.loads(row["partition_values"]),
        stats=str(row["stats"]),
        modification_time=int(row["modification_time"]),
    )
