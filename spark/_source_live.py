"""``lakefold_projection_live_source``: small micro-batches of a *live* reader, read on the driver.

A live projection follows the head in batches of at most ``max_records_per_batch`` records
(20,000 by default, a few hundred at a steady 1,000 changes/s), where the fixed cost of a
Spark task dominates: with the partitioned source (``_source_records``) every micro-batch sends
the reader to a Python worker in a task, which reads its range there. This source is Spark's
``SimpleDataSourceStreamReader``: when Spark asks for the latest offset, the source's driver
process reads the next range at once (the same ranges and records as the partitioned source,
through ``InputQuery``), and the batch's task only scans what Spark cached. An
isolated trial (three queries, ~200 records per batch, load 3-4) took a batch's
``toArrow()`` from ~120 ms to ~55 ms.

Offsets are the partitioned source's (``{"source": alias, "position": next}``), so a
checkpoint written by either reads back with the other. A batch that Spark replays after a
crash (in its offset log, not committed) is read again by ``readBetweenOffsets`` in a task:
reads below the head are final, so it holds exactly the records it held the first time.
A rebuild's large batches keep the partitioned source (parallel reads, one per core).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from lakefold.spark._source_formats import PositionStreamReader, arrow_schema_of
from lakefold.spark._source_inputs import Source, source_from_json, source_to_json
from lakefold.spark._source_positions import position_of
from lakefold.spark._source_records import (
    InputQuery,
    TruncateOptions,
    read_options,
    spark_schema,
    with_storage,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "lakefold_projection_live_source"
#: Largest live batch read on the driver; larger ones use the partitioned source (2M-record
#: batches ran the driver's default 1 GiB heap out of memory).
LIVE_READ_MAX = 100_000


class LiveSourceReader(SimpleDataSourceStreamReader):
    """Reads ``[start, min(head + 1, start + max_records))`` when Spark plans a batch."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self._reader = PositionStreamReader(InputQuery.parse(options), read_options(options),
                                            arrow_schema_of(schema))

    def initialOffset(self) -> dict[str, Any]:
        return self._reader.initialOffset()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[pa.RecordBatch], dict[str, Any]]:
        end = self._reader.latestOffset(start, self._reader.getDefaultReadLimit())
        # Spark keeps the batches until the micro-batch runs, copying the iterator: read now.
        return iter(list(self.readBetweenOffsets(start, end))), end

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]
                           ) -> Iterator[pa.RecordBatch]:
        begin, stop = position_of(start), position_of(end)
        # An empty range yields nothing (Spark refuses even an empty batch for one).
        reader = self._reader
        for positions in reader.query.ranges(begin, stop, reader.options):
            yield from reader.query.read_range(positions, reader.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the stores keep every record (the log is the buffer)."""


class LiveRecordSource(DataSource):
    """``spark.readStream.format("lakefold_projection_live_source")``: the options of
    ``lakefold_projection_source``; streaming only."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema(self.options["dsn"], source_from_json(self.options["source"]))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return LiveSourceReader(dict(self.options), schema)


def live_frame(spark: SparkSession, dsn: str, source: Source, *, max_records: int,
               truncates: TruncateOptions | None = None) -> DataFrame:
    """A streaming DataFrame over one source for a live generation (see the module
    docstring): the columns of ``_source_records.source_frame``, at most ``max_records`` per
    batch."""
    spark.dataSource.register(LiveRecordSource)
    truncates = truncates or TruncateOptions()
    reader = (spark.readStream.format(FORMAT)
              .schema(spark_schema(dsn, source, truncates=truncates.mode))
              .option("dsn", dsn)
              .option("source", source_to_json(source))
              .option("max_records", str(max_records)))
    frame: DataFrame = truncates.apply(with_storage(reader, source)).load()
    return frame
