"""The Spark machinery of every lakefold source: the public formats (``lakefold_events``,
``lakefold_changelog``) and the projections' (``_source_records``, ``_source_live``).

A source supplies a picklable *query* that knows its store's head and how to read a position
range as Arrow; ``PositionStreamReader`` and ``PositionBatchReader`` turn it into Spark's
readers, ``PositionSource`` into a data source (the public formats). Offsets are
``{"position": next}`` plus the query's ``offset_tag`` (a projection's names its input);
``partitions(start, end)`` asks the query for the batch's ranges (``RangeQuery``: split by
``ReadOptions.partition_size``), each read with one query in a task. The queries read the
stores through ``_source_reads``, hand out the record metadata columns of ``_source_columns``
and conform through ``lakefold.schemas.arrow.conform_batch``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Protocol

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

from lakefold.schemas.arrow import spark_schema
from lakefold.spark._source_positions import (
    PositionRange,
    ReadOptions,
    capped_end,
    limit_rows,
    offset,
    position_of,
    split_range,
)
from lakefold.spark.exceptions import SparkTerminalError


class PositionQuery(Protocol):
    """What a source reads: picklable, shipped to every task."""

    def head(self) -> int:
        """The last position readers may see now."""
        ...

    def offset_tag(self) -> dict[str, Any]:
        """What every offset carries besides the position (a projection names its input)."""
        ...

    def ranges(self, start: int, end: int, options: ReadOptions) -> list[PositionRange]:
        """The partitions of a batch ``[start, end)`` (``RangeQuery``: ``split_range``)."""
        ...

    def arrow_schema(self) -> pa.Schema:
        """The source's columns."""
        ...

    def read_range(self, positions: PositionRange, schema: pa.Schema
                   ) -> Iterator[pa.RecordBatch]:
        """The records at ``positions`` as batches of ``schema`` (runs in a task)."""
        ...

    def cut(self, start: int, end: int, limit: int | None, round_: int) -> int:
        """The end of planning round ``round_``'s batch from ``start``: ``end`` (the head's)
        lowered to at most ``limit`` records and to a cut shared with other sources
        (``RangeQuery``: the limit only)."""
        ...


class RangeQuery:
    """A query's defaults: offsets with the position only, a batch split by ``split_range``."""

    def offset_tag(self) -> dict[str, Any]:
        return {}

    def ranges(self, start: int, end: int, options: ReadOptions) -> list[PositionRange]:
        return split_range(start, end, options)

    def cut(self, start: int, end: int, limit: int | None, round_: int) -> int:
        return capped_end(start, end - 1, limit)


def partition_range(partition: InputPartition) -> PositionRange:
    """The position range a partition stands for."""
    value = partition.value
    if value is None:  # Spark's stand-in when a batch read planned no partition
        return PositionRange(1, 1)
    if not isinstance(value, PositionRange):
        raise SparkTerminalError(f"not a lakefold position range partition: {value!r}")
    return value


def arrow_schema_of(spark_struct: Any) -> pa.Schema:
    """The Arrow schema of a Spark struct (timestamps in UTC), as a reader yields it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_struct, timezone="UTC")


class PositionStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a query's positions, up to ``maxRecordsPerTrigger`` each."""

    def __init__(self, query: PositionQuery, options: ReadOptions, schema: pa.Schema) -> None:
        self.query = query
        self.options = options
        self.schema = schema
        self.target_head: int | None = None
        self.rounds = 0  # plannings so far (see ``PositionQuery.cut``)

    def _offset(self, position: int) -> dict[str, Any]:
        return {**self.query.offset_tag(), **offset(position)}

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(self.options.starting_position)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target_head = self.query.head()

    def _head(self) -> int:
        return self.target_head if self.target_head is not None else self.query.head()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = position_of(start)
        end = max(begin, self._head() + 1)
        round_, self.rounds = self.rounds, self.rounds + 1
        return self._offset(self.query.cut(begin, end, limit_rows(limit), round_))

    def reportLatestOffset(self) -> dict[str, Any]:
        return self._offset(self._head() + 1)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = self.query.ranges(position_of(start), position_of(end), self.options)
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.query.read_range(partition_range(partition), self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the store, not its readers, decides what it keeps (the event
        log keeps everything; compaction trims changelogs); consumers keep checkpoints (a
        projection's readers register their positions themselves)."""


class PositionBatchReader(DataSourceReader):
    """The query's records from ``startingPosition`` up to ``endingPosition`` (or the head)."""

    def __init__(self, query: PositionQuery, options: ReadOptions, schema: pa.Schema) -> None:
        self.query = query
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        end = self.options.ending_position
        if end is None:
            end = self.query.head() + 1
        ranges = self.query.ranges(self.options.starting_position, end, self.options)
        return [InputPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.query.read_range(partition_range(partition), self.schema)


class PositionSource(DataSource):
    """A Spark data source over ``parse_query``'s positions; subclasses name it."""

    source_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.source_name

    def parse_query(self, options: dict[str, str]) -> PositionQuery:
        raise NotImplementedError

    def _parsed(self) -> tuple[PositionQuery, ReadOptions]:
        options = dict(self.options)
        return self.parse_query(options), ReadOptions.parse(options)

    def schema(self) -> Any:
        query, _ = self._parsed()
        return spark_schema(query.arrow_schema())

    def reader(self, schema: Any) -> DataSourceReader:
        query, options = self._parsed()
        return PositionBatchReader(query, options, arrow_schema_of(schema))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        query, options = self._parsed()
        if options.ending_position is not None:
            raise SparkTerminalError("endingPosition is for batch reads; a stream has no end")
        return PositionStreamReader(query, options, arrow_schema_of(schema))
