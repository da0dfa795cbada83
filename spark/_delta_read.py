"""Reading a Delta table into Spark without delta-spark: the delta-rs snapshot picks the files.

The snapshot's file list (delta-rs) goes to Spark's own Parquet reader with ``basePath`` set to
the table root, so that Hive-style partition directories become columns, and with the table's
schema given explicitly, so that partition columns keep their Delta types and columns missing
from older files read as null.

This reader needs no JVM library, so it works on every session, and it is what lakefold uses
(measured against delta-spark in ARCHITECTURE.md, "delta-spark and delta-rs"). It refuses a
table that needs a reader feature it does not implement (deletion vectors, column mapping);
a session started with delta-spark (``LAKEFOLD_DELTA_SPARK``, ``_delta_spark``) reads such a
table with ``spark.read.format("delta")`` instead.

Partition pruning happens twice: ``partition_filters`` prune the file list from the Delta log
before Spark sees it, and filters on partition columns in the query become Spark
``PartitionFilters`` that skip the remaining files of other partitions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from lakefold.core.object_store import storage_options_for
from lakefold.spark._delta_commit import require_table
from lakefold.spark._delta_spark import delta_spark_dataframe, has_delta_spark
from lakefold.spark._delta_target import normalize_table_uri
from lakefold.spark.exceptions import SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# (column, op, value) as delta-rs takes them: op in =, !=, <, <=, >, >=, in, not in.
PartitionFilter = tuple[str, str, Any]
# Tuple filters (a conjunction), or a SQL predicate string such as "region = 'eu'".
FileFilter = Sequence[PartitionFilter] | str

# Reader features lakefold's file-list reader handles; anything else would silently misread.
_READABLE_FEATURES = {"timestampNtz"}


@dataclass(frozen=True)
class DeltaSnapshot:
    """The files and schema of one version of a table, as a reader needs them."""

    uri: str
    version: int
    schema: pa.Schema
    partition_by: tuple[str, ...]
    files: tuple[str, ...]


def load_snapshot(path: str, *, version: int | None = None, as_of: dt.datetime | None = None,
                  partition_filters: FileFilter | None = None) -> DeltaSnapshot:
    """The snapshot at the latest version, at ``version``, or as of a timestamp.

    Raises NotADeltaTableError for a path without a Delta table, SparkLayerError for a version
    that does not exist (or was vacuumed) and for tables that need a reader feature this reader
    does not implement (deletion vectors, column mapping).
    """
    uri = normalize_table_uri(path)
    table = require_table(uri)
    try:
        if version is not None:
            table.load_as_version(version)
        elif as_of is not None:
            table.load_as_version(as_of)
    except (DeltaError, ValueError, OSError) as e:
        raise SparkTerminalError(
            f"cannot load {uri} at {version if version is not None else as_of}: {e}; "
            f"the table's versions are listed by `DeltaTable(path).history()`"
        ) from e
    unsupported = _unsupported_features(table)
    if unsupported:
        raise SparkTerminalError(
            f"{uri} uses Delta reader feature(s) {sorted(unsupported)} that lakefold's reader "
            "does not support; read it with delta-spark (LAKEFOLD_DELTA_SPARK=true), or "
            "rewrite it without them"
        )
    try:
        if not partition_filters:
            files = table.file_uris()
        elif isinstance(partition_filters, str):
            files = table.file_uris(file_pruning_predicate=partition_filters)
        else:
            files = table.file_uris(file_pruning_predicate=list(partition_filters))
    except (DeltaError, ValueError) as e:
        raise SparkTerminalError(
            f"bad partition filter {partition_filters!r} for {uri}: {e}") from e
    return DeltaSnapshot(
        uri=uri,
        version=table.version(),
        schema=pa.schema(table.schema().to_arrow()),
        partition_by=tuple(table.metadata().partition_columns),
        files=tuple(files),
    )


def _unsupported_features(table: DeltaTable) -> set[str]:
    """The table's reader features that lakefold's file-list reader does not implement.

    Reader version 2 lists no features: it implies column mapping, which delta-spark writes
    that way (``delta.columnMapping.mode`` set, protocol 2/5); files then hold physical
    column names, which this reader would read as nulls. A reader version above 3 is unknown
    to it."""
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    if protocol.min_reader_version == 2 and table.metadata().configuration.get(
            "delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    if protocol.min_reader_version > 3:
        features.add(f"readerVersion{protocol.min_reader_version}")
    return features - _READABLE_FEATURES


def needs_delta_spark(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` is a local table that only delta-spark can read here: the session has
    delta-spark, and the table uses a reader feature the file-list reader refuses."""
    uri = normalize_table_uri(path)
    return "://" not in uri and has_delta_spark(spark) \
        and bool(_unsupported_features(require_table(uri)))


def spark_schema_of(schema: pa.Schema) -> Any:
    """The Spark StructType for a Delta table's Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def read_delta(spark: SparkSession, path: str, *, version: int | None = None,
               as_of: dt.datetime | None = None,
               partition_filters: FileFilter | None = None) -> DataFrame:
    """The table (at the latest version, ``version``, or ``as_of``) as a Spark DataFrame.

    The DataFrame reads exactly the files of that snapshot: later commits, and files that were
    written but never committed, are invisible to it. ``partition_filters`` (tuples, or a SQL
    predicate) prune the file list with the log's partition values and column statistics; they
    select files, not rows, so filter the DataFrame too for an exact result. A table that
    needs delta-spark (``needs_delta_spark``) is read by delta-spark, without file pruning.
    """
    if needs_delta_spark(spark, path):
        return delta_spark_dataframe(spark, normalize_table_uri(path), version=version,
                                     as_of=as_of)
    snapshot = load_snapshot(path, version=version, as_of=as_of,
                             partition_filters=partition_filters)
    return snapshot_dataframe(spark, snapshot)


def snapshot_dataframe(spark: SparkSession, snapshot: DeltaSnapshot) -> DataFrame:
    """A Spark DataFrame over the snapshot's files (empty, with the schema, when none)."""
    schema = spark_schema_of(snapshot.schema)
    if not snapshot.files:
        return spark.createDataFrame([], schema)
    if "://" in snapshot.uri:
        return _object_store_dataframe(spark, snapshot, schema)
    reader = spark.read.schema(schema).option("basePath", snapshot.uri)
    frame = reader.parquet(*snapshot.files)
    # Spark appends partition columns at the end; keep the table's column order.
    return frame.select(*[f"`{name.replace('`', '``')}`" for name in snapshot.schema.names])


def _object_store_dataframe(spark: SparkSession, snapshot: DeltaSnapshot,
                            schema: Any) -> DataFrame:
    """The snapshot's files read by Spark's Python workers through pyarrow's S3 file system
    (one task per file; partition values from the Hive-style directories): Spark's JVM reader
    would need the hadoop-aws jars and their own S3 settings."""
    options = storage_options_for(snapshot.uri)
    table_schema = snapshot.schema
    partition_by = snapshot.partition_by
    root = snapshot.uri.rstrip("/") + "/"
    files = spark.createDataFrame([(f,) for f in snapshot.files], "file STRING")
    files = files.repartition(min(len(snapshot.files), spark.sparkContext.defaultParallelism))

    def read(batches):  # type: ignore[no-untyped-def]  # runs in Spark's Python workers
        import pyarrow.parquet as pq

        from lakefold.core.object_store import filesystem_for

        for batch in batches:
            for uri in batch.column(0).to_pylist():
                fs, path = filesystem_for(uri, options)
                yield from _file_batches(pq.read_table(path, filesystem=fs),
                                         uri.removeprefix(root), table_schema, partition_by)

    return files.mapInArrow(read, schema)


def _file_batches(data: pa.Table, relative: str, schema: pa.Schema,
                  partition_by: tuple[str, ...]) -> list[pa.RecordBatch]:
    """One data file's rows in the table's schema: partition columns from ``relative``'s
    ``column=value`` directories, columns the file lacks as nulls."""
    from urllib.parse import unquote

    from lakefold.spark._delta_files import HIVE_NULL

    values: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        column, sep, value = part.partition("=")
        if sep and column in partition_by:
            text = unquote(value)
            values[column] = None if text == HIVE_NULL else text
    columns = []
    for field in schema:
        if field.name in values:
            column = pa.array([values[field.name]] * data.num_rows, pa.string())
            columns.append(column.cast(field.type))
        elif field.name in data.column_names:
            columns.append(data.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(data.num_rows, field.type))
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(columns, schema=schema).to_batches()
    return batches


def table_version(path: str) -> int:
    """The latest version of the Delta table at ``path``."""
    uri = normalize_table_uri(path)
    return DeltaTable(uri, storage_options=storage_options_for(uri)).version()
