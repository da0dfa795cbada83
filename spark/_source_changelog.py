"""``lakefold_changelog``: a captured table's changelog stream as a Spark source.

    spark.readStream.format("lakefold_changelog")
        .option("stream", "public.orders")        # required: the changelog stream
        .option("dsn", store_dsn)                 # default: the settings' store DSN
        .option("maxRecordsPerTrigger", 100000)
        .load()

Columns: the change metadata (``_position``, ``_op``, ``_commit_lsn``, ``_ordinal``, ``_xid``,
``_commit_ts``, ``_schema_version``), then one typed column per column of the captured table,
typed from the table's PostgreSQL column types as the capture stored them (int4 → int,
numeric(p,s) → decimal(p,s), timestamptz → timestamp, arrays → arrays ...; time-of-day and
interval values as text, since Delta has no such types). An insert or update carries the new
row, a delete the key columns.

The columns are those of the stream's newest schema version when the query starts; records of
older versions are mapped onto them by name. A column the source table gains while the query
runs appears after the query restarts (Spark fixes a stream's schema for its lifetime).

Offsets are ``{"position": next}`` over the stream's positions. The head moves only at source
transaction boundaries, so a micro-batch never holds half a source transaction, and a range
below the head is final (compaction only removes records a later record supersedes by key).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from lakefold.capture import ChangelogStore, read_changelog_range
from lakefold.schemas.arrow import conform_batch, spark_compatible, spark_schema
from lakefold.spark._positions import (
    PositionRange,
    ReadOptions,
    capped_end,
    offset,
    position_of,
    split_range,
)
from lakefold.spark._store_dsn import store_dsn_option
from lakefold.spark.exceptions import SparkLayerError

SOURCE_NAME = "lakefold_changelog"


@dataclass(frozen=True)
class ChangelogQuery:
    """Which stream a changelog source reads, and where; picklable."""

    dsn: str
    stream: str

    @classmethod
    def parse(cls, options: dict[str, str]) -> ChangelogQuery:
        lowered = {k.lower(): v for k, v in options.items()}
        stream = lowered.get("stream")
        if not stream:
            raise SparkLayerError(
                "the lakefold_changelog source needs .option('stream', 'schema.table'); "
                "`ChangelogStore(dsn).streams()` lists them"
            )
        return cls(dsn=store_dsn_option(lowered), stream=stream)

    def head(self) -> int:
        with ChangelogStore(self.dsn) as store:
            return store.head(self.stream)

    def arrow_schema(self) -> pa.Schema:
        """The typed columns of the newest schema version (from an empty typed read)."""
        with ChangelogStore(self.dsn) as store:
            head = store.head(self.stream)
            return spark_compatible(store.read(self.stream, from_position=head + 1).schema)


def _positions(partition: InputPartition) -> PositionRange:
    value = partition.value
    if value is None:  # Spark's stand-in when a batch read planned no partition
        return PositionRange(1, 1)
    if not isinstance(value, PositionRange):
        raise SparkLayerError(f"not a lakefold position range partition: {value!r}")
    return value


def _arrow_schema_of(spark_struct: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_struct, timezone="UTC")


def read_range(query: ChangelogQuery, positions: PositionRange, schema: pa.Schema
               ) -> Iterator[pa.RecordBatch]:
    """The records at ``positions``, conformed to the query's schema (in a task)."""
    # One query per partition (partitions are sized by ReadOptions.partition_size).
    for batch in read_changelog_range(query.dsn, query.stream, positions.start, positions.end,
                                      batch_rows=max(len(positions), 1)):
        if batch.num_rows:
            yield conform_batch(batch, schema)


class ChangelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of one changelog stream."""

    def __init__(self, query: ChangelogQuery, options: ReadOptions, schema: pa.Schema) -> None:
        self.query = query
        self.options = options
        self.schema = schema
        self.target_head: int | None = None

    def initialOffset(self) -> dict[str, int]:
        return offset(self.options.starting_position)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target_head = self.query.head()

    def _head(self) -> int:
        return self.target_head if self.target_head is not None else self.query.head()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offset(capped_end(position_of(start), self._head(), rows))

    def reportLatestOffset(self) -> dict[str, int]:
        return offset(self._head() + 1)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = split_range(position_of(start), position_of(end), self.options)
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.query, _positions(partition), self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: compaction, not consumers, trims the changelog."""


class ChangelogBatchReader(DataSourceReader):
    """The stream's records from ``startingPosition`` up to ``endingPosition`` (or the head)."""

    def __init__(self, query: ChangelogQuery, options: ReadOptions, schema: pa.Schema) -> None:
        self.query = query
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        end = self.options.ending_position
        if end is None:
            end = self.query.head() + 1
        ranges = split_range(self.options.starting_position, end, self.options)
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.query, _positions(partition), self.schema)


class ChangelogDataSource(DataSource):
    """A changelog stream as a Spark data source named ``lakefold_changelog``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _parsed(self) -> tuple[ChangelogQuery, ReadOptions]:
        options = dict(self.options)
        return ChangelogQuery.parse(options), ReadOptions.parse(options)

    def schema(self) -> Any:
        query, _ = self._parsed()
        return spark_schema(query.arrow_schema())

    def reader(self, schema: Any) -> DataSourceReader:
        query, options = self._parsed()
        return ChangelogBatchReader(query, options, _arrow_schema_of(schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        query, options = self._parsed()
        if options.ending_position is not None:
            raise SparkLayerError("endingPosition is for batch reads; a stream has no end")
        return ChangelogStreamReader(query, options, _arrow_schema_of(schema))
