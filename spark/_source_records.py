"""``lakefold_projection_source``: the partitioned record source every projection reads through.

One streaming (and batch, for a fixed range) Spark data source over one input
(``_source_inputs``: a changelog stream or some events), with the record metadata columns of
``_source_columns`` in front. It is the public formats' reader (``_source_formats``) over an
``InputQuery``: the same offsets arithmetic, read limits, partition ranges and conform step;
what differs is the query (offsets that name the input, event columns, truncate modes). Live
generations whose batches are small read through its driver-side twin, ``_source_live``.

Offsets are ``{"source": alias, "position": p}`` where ``p`` is the next position to read:
a micro-batch covers ``[start.position, end.position)``. ``latestOffset`` moves at most
``max_records`` positions per trigger (``ReadMaxRows``, honoured in processing-time mode), so a
live projection takes small batches and a rebuild large ones. A range is split into parallel
partitions of about ``partition_records`` positions (``_source_positions.split_range``, as the
public formats do), each read by ``_source_reads.read`` in one worker.

Reads below the head are final (the stores guarantee it: the event store hands out only
sequenced positions, the changelog only committed ones), so a micro-batch replayed after a
crash reads exactly the same records, which is what makes the sinks' batch ids meaningful.

Option ``truncates`` says how a changelog's truncate records reach the reader (``keep``,
``drop``, ``cut`` or ``fanout``; see ``_source_truncates``). ``cut`` and ``fanout`` need the
positions of all the batch's truncates, which ``InputQuery.ranges`` asks the store for once
per batch and hands to every partition; a fold's ``fanout`` also reads the generation's keys
(option ``fold``: ``{"name", "generation"}``; see ``_source_truncates``).

Options (strings, as Spark passes them): ``dsn`` (the store; given by the caller, never read
from settings in a worker), ``source`` (JSON, ``source_to_json``), ``max_records``,
``partition_records``, ``start_position``, ``columns`` (event columns to fetch; the others are
null), ``truncates`` and ``fold``; for a batch read ``start`` and ``end``.

The source is registered on the session under ``lakefold_projection_source`` and is part of
the installed package, so any Spark worker can import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader

from lakefold.schemas.arrow import conform_batch
from lakefold.spark import _source_delta, _source_reads
from lakefold.spark._source_cuts import CutGroup, cut_end
from lakefold.spark._source_formats import (
    PositionBatchReader,
    PositionStreamReader,
    arrow_schema_of,
)
from lakefold.spark._source_inputs import (
    ChangelogSource,
    DeltaSource,
    Source,
    source_from_json,
    source_to_json,
)
from lakefold.spark._source_positions import PositionRange, ReadOptions, capped_end, split_range
from lakefold.spark._source_truncates import (
    FAN_KEY_COLUMN,
    TRUNCATED_AT_COLUMN,
    FoldKeys,
    Mode,
    apply_mode,
)
from lakefold.spark.exceptions import SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "lakefold_projection_source"
DEFAULT_PARTITION_RECORDS = 500_000  # a 1M-record rebuild batch: one read per core here


@dataclass(frozen=True)
class InputRange(PositionRange):
    """A partition's positions ``[start, end)``, with the positions of the whole micro-batch's
    truncates (modes cut and fanout)."""

    truncates: tuple[int, ...] = ()


@dataclass(frozen=True)
class InputQuery:
    """One input of a projection as a ``PositionQuery`` of ``_source_formats``: picklable,
    shipped to every task."""

    dsn: str
    source: Source
    #: The event columns to fetch (None: all of them); the others are null.
    columns: tuple[str, ...] | None = None
    truncates: Mode = "keep"
    #: A fold's (name, generation), whose keys a ``fanout`` truncate reaches.
    fold: tuple[str, int] | None = None
    #: The sources whose batches end at one source commit (``_source_cuts``).
    cuts: CutGroup | None = None
    #: A Delta input's object-store options (option ``storage``; workers have no registry).
    storage: tuple[tuple[str, str], ...] | None = None

    @property
    def storage_options(self) -> dict[str, str] | None:
        return dict(self.storage) if self.storage is not None else None

    @classmethod
    def parse(cls, options: dict[str, str]) -> InputQuery:
        source = source_from_json(options["source"])
        columns = options.get("columns")
        modes: dict[str, Mode] = {"drop": "drop", "cut": "cut", "fanout": "fanout"}
        truncates: Mode = modes.get(options.get("truncates", "keep"), "keep")
        if not isinstance(source, ChangelogSource):
            truncates = "keep"  # events have no truncates
        fold = json.loads(options["fold"]) if options.get("fold") else None
        storage = json.loads(options["storage"]) if options.get("storage") else None
        return cls(dsn=options["dsn"], source=source,
                   storage=tuple(sorted(storage.items())) if storage is not None else None,
                   columns=tuple(columns.split(",")) if columns else None,
                   truncates=truncates,
                   fold=(str(fold["name"]), int(fold["generation"])) if fold else None,
                   cuts=CutGroup.from_json(options["cuts"]) if options.get("cuts") else None)

    def offset_tag(self) -> dict[str, Any]:
        return {"source": self.source.alias}

    def head(self) -> int:
        if isinstance(self.source, DeltaSource):
            return _source_delta.head(self.source, self.storage_options)
        return _source_reads.head(self.dsn, self.source)

    def cut(self, start: int, end: int, limit: int | None, round_: int) -> int:
        if isinstance(self.source, DeltaSource):  # whole table versions
            return _source_delta.batch_end(self.source, start, end, limit,
                                           self.storage_options)
        if self.cuts is None or not isinstance(self.source, ChangelogSource):
            return capped_end(start, end - 1, limit)
        return cut_end(self.dsn, self.cuts, self.source.table, round_, start, end, limit)

    def arrow_schema(self) -> pa.Schema:
        if isinstance(self.source, DeltaSource):
            return _source_delta.arrow_schema(self.source, self.storage_options)
        return _source_reads.arrow_schema(self.dsn, self.source)

    def batch_truncates(self, begin: int, stop: int) -> tuple[int, ...]:
        """Modes cut and fanout: the positions of the truncates in ``[begin, stop)``."""
        if self.truncates not in ("cut", "fanout") or stop <= begin:
            return ()
        assert isinstance(self.source, ChangelogSource)  # noqa: S101 - see parse
        found = _source_reads.changelog_truncates(self.dsn, self.source.table, begin, stop)
        return tuple(t.position for t in found)

    def ranges(self, start: int, end: int, options: ReadOptions) -> list[PositionRange]:
        """The batch's partitions, each told of every truncate of the batch (asked once); a
        Delta input's are runs of whole versions."""
        if isinstance(self.source, DeltaSource):
            return _source_delta.batch_ranges(self.source, start, end, options,
                                              self.storage_options)
        truncates = self.batch_truncates(start, end)
        return [InputRange(r.start, r.end, truncates) for r in split_range(start, end, options)]

    def read_range(self, positions: PositionRange, schema: pa.Schema
                   ) -> Iterator[pa.RecordBatch]:
        if isinstance(self.source, DeltaSource):
            yield from _source_delta.read_range(self.source, positions, schema,
                                                self.storage_options)
            return
        truncates = positions.truncates if isinstance(positions, InputRange) else ()
        keys: list[str] | None = None
        for batch in _source_reads.read(self.dsn, self.source, positions.start, positions.end,
                                        columns=self.columns):
            if self.truncates == "fanout" and keys is None:
                keys = FoldKeys(self.dsn).keys(*self.fold) if self.fold else []
            batch = apply_mode(batch, self.truncates, truncates=truncates, keys=keys)
            yield conform_batch(batch, schema)


def read_options(options: dict[str, str]) -> ReadOptions:
    """The position options of a projection source (``start_position``, ``max_records``,
    ``partition_records``; for a batch read ``start`` and ``end``)."""
    start = options.get("start") or options.get("start_position") or "0"
    end = options.get("end")
    return ReadOptions(
        starting_position=int(start),
        ending_position=int(end) if end is not None else None,
        max_records_per_trigger=int(options.get("max_records", "20000")),
        partition_size=max(1, int(options.get("partition_records",
                                              str(DEFAULT_PARTITION_RECORDS)))))


class RecordSource(DataSource):
    """``spark.readStream.format("lakefold_projection_source")`` with options ``dsn``,
    ``source`` (JSON), ``max_records``, ``partition_records``; the schema must be given.
    ``spark.read`` with ``start`` and ``end`` reads a fixed range."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        source = source_from_json(self.options["source"])
        return spark_schema(self.options["dsn"], source)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = dict(self.options)
        return PositionStreamReader(InputQuery.parse(options), read_options(options),
                                    arrow_schema_of(schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = dict(self.options)
        query = InputQuery.parse(options)
        if query.truncates == "fanout":
            raise SparkTerminalError(
                "a fixed range is never read for a fold (truncates='fanout'); rebuild the fold")
        return PositionBatchReader(query, read_options(options), arrow_schema_of(schema))


def register(spark: SparkSession) -> None:
    """Register the source on ``spark`` (idempotent)."""
    spark.dataSource.register(RecordSource)


def spark_schema(dsn: str, source: Source, *, truncates: Mode = "keep") -> StructType:
    """The Spark schema of a source's frame (metadata columns first); a fold's changelog
    frame (``truncates="fanout"``) has ``_fan_key`` and ``_truncated_at`` too."""
    from pyspark.sql.pandas.types import from_arrow_schema

    result: StructType = from_arrow_schema(_source_reads.arrow_schema(dsn, source))
    if truncates == "fanout" and isinstance(source, ChangelogSource):
        from pyspark.sql.types import LongType, StringType

        result = result.add(FAN_KEY_COLUMN, StringType()).add(TRUNCATED_AT_COLUMN, LongType())
    return result


@dataclass(frozen=True)
class TruncateOptions:
    """How a frame's changelog source hands over truncate records (see ``_source_truncates``):
    ``mode``, and for a fold's ``fanout`` the generation whose keys to fan out to; and, for a
    fold over several changelogs, the group whose batches end at one source commit."""

    mode: Mode = "keep"
    fold: str | None = None
    generation: int | None = None
    #: A fold's changelog sources end their batches at one source commit (``_source_cuts``).
    cuts: CutGroup | None = None

    def apply(self, reader: Any) -> Any:
        reader = reader.option("truncates", self.mode)
        if self.cuts is not None:
            reader = reader.option("cuts", self.cuts.to_json())
        if self.fold is not None and self.generation is not None:
            reader = reader.option("fold", json.dumps({"name": self.fold,
                                                       "generation": self.generation}))
        return reader


def with_storage(reader: Any, source: Source) -> Any:
    """``reader`` with a Delta input's object-store options (option ``storage``): Spark's
    Python workers are other processes, without this process's object-store registry."""
    if not isinstance(source, DeltaSource):
        return reader
    from lakefold.core.object_store import storage_options_for

    options = storage_options_for(source.uri)
    return reader.option("storage", json.dumps(options)) if options is not None else reader


def range_frame(spark: SparkSession, dsn: str, source: Source, start: int, end: int, *,
                truncates: Mode = "keep") -> DataFrame:
    """A batch DataFrame of positions ``[start, end)`` of one source."""
    register(spark)
    reader = (spark.read.format(FORMAT)
              .schema(spark_schema(dsn, source))
              .option("dsn", dsn)
              .option("source", source_to_json(source))
              .option("start", str(start))
              .option("end", str(end))
              .option("truncates", truncates))
    frame: DataFrame = with_storage(reader, source).load()
    return frame


def source_frame(spark: SparkSession, dsn: str, source: Source, *, max_records: int,
                 partition_records: int = DEFAULT_PARTITION_RECORDS,
                 columns: tuple[str, ...] | None = None,
                 truncates: TruncateOptions | None = None) -> DataFrame:
    """A streaming DataFrame over one source, with the projection metadata columns; with
    ``columns``, only those event columns are fetched (the others stay null)."""
    register(spark)
    truncates = truncates or TruncateOptions()
    reader = (spark.readStream.format(FORMAT)
              .schema(spark_schema(dsn, source, truncates=truncates.mode))
              .option("dsn", dsn)
              .option("source", source_to_json(source))
              .option("max_records", str(max_records))
              .option("partition_records", str(partition_records)))
    if columns is not None:
        reader = reader.option("columns", ",".join(columns))
    frame: DataFrame = truncates.apply(with_storage(reader, source)).load()
    return frame
