"""``lakefold_changelog``: a captured table's changelog stream as a Spark source.

    spark.readStream.format("lakefold_changelog")
        .option("stream", "public.orders")        # required: the changelog stream
        .option("dsn", store_dsn)                 # default: the settings' store DSN
        .option("maxRecordsPerTrigger", 100000)
        .load()

Columns: the record metadata columns (``_position``, ``_ts``, ``_type``, ``_stream``,
``_deleted``; see ``_source_columns``), the capture's change columns (``_op``, ``_commit_lsn``,
``_ordinal``, ``_xid``, ``_commit_ts``, ``_schema_version``), then one typed column per column
of the captured table,
typed from the table's PostgreSQL column types as the capture stored them (int4 → int,
numeric(p,s) → decimal(p,s), timestamptz → timestamp, arrays → arrays ...; time-of-day and
interval values as text, since Delta has no such types). An insert or update carries the new
row, a delete the key columns.

The columns are those of the stream's newest schema version when the query starts; records of
older versions are mapped onto them by name. A column the source table gains while the query
runs appears after the query restarts (Spark fixes a stream's schema for its lifetime).

Offsets are ``{"position": next}`` over the stream's positions. The head moves only at source
transaction boundaries, so a micro-batch never holds half a source transaction. Compaction
removes records a later record of the same key supersedes, and tombstones past their
retention. This source is not a durable reader (it holds no position in the store, see
``ChangelogStore.commit_reader``): a query that falls further behind than the tombstone
retention while compaction runs can miss deletes. Projections hold their positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lakefold.schemas.arrow import conform_batch, spark_compatible
from lakefold.spark import _source_reads
from lakefold.spark._source_columns import changelog_records
from lakefold.spark._source_formats import PositionSource, RangeQuery
from lakefold.spark._source_positions import PositionRange
from lakefold.spark._store_dsn import store_dsn_option
from lakefold.spark.exceptions import SparkTerminalError
from lakefold.store import read_changelog_range

SOURCE_NAME = "lakefold_changelog"


@dataclass(frozen=True)
class ChangelogQuery(RangeQuery):
    """Which stream a changelog source reads, and where; picklable."""

    dsn: str
    stream: str

    @classmethod
    def parse(cls, options: dict[str, str]) -> ChangelogQuery:
        lowered = {k.lower(): v for k, v in options.items()}
        stream = lowered.get("stream")
        if not stream:
            raise SparkTerminalError(
                "the lakefold_changelog source needs .option('stream', 'schema.table'); "
                "`ChangelogStore(dsn).streams()` lists them"
            )
        return cls(dsn=store_dsn_option(lowered), stream=stream)

    def head(self) -> int:
        return _source_reads.changelog_head(self.dsn, self.stream)

    def arrow_schema(self) -> pa.Schema:
        """The metadata columns, then the typed columns of the newest schema version (from an
        empty typed read)."""
        return spark_compatible(_source_reads.changelog_arrow_schema(self.dsn, self.stream))

    def read_range(self, positions: PositionRange, schema: pa.Schema
                   ) -> Iterator[pa.RecordBatch]:
        """The records at ``positions``, conformed to ``schema`` (in a task)."""
        # One query per partition (partitions are sized by ReadOptions.partition_size).
        for batch in read_changelog_range(self.dsn, self.stream, positions.start,
                                          positions.end, batch_rows=max(len(positions), 1)):
            if batch.num_rows:
                yield conform_batch(changelog_records(batch, self.stream), schema)


class ChangelogDataSource(PositionSource):
    """A changelog stream as a Spark data source named ``lakefold_changelog``."""

    source_name = SOURCE_NAME

    def parse_query(self, options: dict[str, str]) -> ChangelogQuery:
        return ChangelogQuery.parse(options)
