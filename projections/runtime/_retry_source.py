"""``lakefold_projection_retries``: a fold generation's dead letters queued for another attempt.

A streaming Spark source over the projection's own dead-letter table (not a store input):
``lakefold dlq retry`` queues fold records with a retry sequence number, and the fold reads
them beside its inputs (see ``_fold``), with the record metadata columns of the inputs
(``lakefold.spark._source_columns``) plus the fold key and the dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

RETRY_FORMAT = "lakefold_projection_retries"
RETRY_SCHEMA = ("_source string, _position long, _ts timestamp, _type string, _stream string, "
                "_fkey string, _retry string")


def _retry_head(dsn: str, name: str, generation: int) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('lakefold.projection_dead_letters') IS NOT NULL"
                            ).fetchone()[0]:  # type: ignore[index]
            return 0
        row = conn.execute(
            "SELECT coalesce(max(retry_seq), 0) FROM lakefold.projection_dead_letters "
            "WHERE name = %s AND generation = %s AND stage = 'fold'", (name, generation)
        ).fetchone()
    return int(row[0]) if row else 0


class RetryReader(DataSourceStreamReader):
    """Fold records queued for another attempt (``lakefold dlq retry``), by retry sequence
    number: offsets are ``{"source": "_retry", "position": next sequence number}``. A retry
    that failed again loses its sequence number, so a replayed batch skips it (it is back in
    the dead letters); a resolved one keeps it, so a replayed batch folds it again."""

    def __init__(self, options: dict[str, str]) -> None:
        self.dsn = options["dsn"]
        self.name = options["name"]
        self.generation = int(options["generation"])

    def _offset(self, position: int) -> dict[str, Any]:
        return {"source": "_retry", "position": position}

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(_retry_head(self.dsn, self.name, self.generation) + 1)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        head = _retry_head(self.dsn, self.name, self.generation) + 1
        return self._offset(max(int(start["position"]), head))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = int(start["position"]), int(end["position"])
        return [InputPartition((begin, stop))] if stop > begin else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        import psycopg

        from lakefold.projections.definitions import _codec
        from lakefold.projections.definitions._codec import key_text

        start, end = partition.value[:2]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT record FROM lakefold.projection_dead_letters WHERE name = %s "
                "AND generation = %s AND stage = 'fold' AND retry_seq >= %s AND retry_seq < %s "
                "ORDER BY retry_seq", (self.name, self.generation, start, end)).fetchall()
        for (record,) in rows:
            decoded = _codec.loads(json.dumps(record))
            key = decoded.get("key")
            yield (decoded["source"], int(decoded["position"]), decoded.get("timestamp"),
                   decoded["type"], decoded["stream"],
                   None if key is None else key_text(key), json.dumps(record))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""


class RetrySource(DataSource):
    """``spark.readStream.format("lakefold_projection_retries")`` (options dsn, name,
    generation): fold records queued for retry."""

    @classmethod
    def name(cls) -> str:
        return RETRY_FORMAT

    def schema(self) -> str:
        return RETRY_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RetryReader(dict(self.options))


def retry_frame(spark: SparkSession, dsn: str, name: str, generation: int) -> DataFrame:
    """The streaming frame of a fold generation's retried dead letters."""
    spark.dataSource.register(RetrySource)
    return (spark.readStream.format(RETRY_FORMAT).schema(RETRY_SCHEMA)
            .option("dsn", dsn).option("name", name).option("generation", str(generation))
            .load())
