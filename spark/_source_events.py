"""``lakefold_events``: the event store as a Spark source, streaming and batch.

    spark.readStream.format("lakefold_events")
        .option("dsn", store_dsn)                 # default: the settings' store DSN
        .option("category", "order")              # optional: one category
        .option("types", "order.placed,order.paid")  # optional: some event types
        .option("registry", "myapp.events:registry")  # optional: typed `data` struct
        .option("maxRecordsPerTrigger", 100000)
        .option("columns", "position,stream_id,type,data")  # optional: read only these
        .load()

Columns: the record metadata columns (``_position``, ``_ts``, ``_type``, ``_stream``,
``_deleted``; see ``_source_columns``), then the event store's ``position``, ``event_id``,
``stream_id``, ``stream_version``, ``category``, ``type``, ``schema_version``, ``data``,
``metadata``, ``correlation_id``, ``causation_id``, ``recorded_at``. ``data`` is JSON text,
or, with ``registry``, a struct typed by the registered pydantic models of the selected types,
payloads upcast to their current version. With a registry, ``columns`` may name payload fields
(``"position,data.amount,data.customer"``): ``data`` then holds only those fields (Spark cannot
prune a Python source's columns itself, and fewer fields are faster to decode and to hand to
the JVM). With ``columns``, the frame has only the named columns, metadata columns included
(``"_position,_type,data"``).

Offsets are ``{"position": next}`` over the store's global positions; only positions up to the
store's head are handed out, and the head only covers finished transactions, so a micro-batch
range is final: replaying it after a crash reads the same events. ``maxRecordsPerTrigger``
bounds the positions per micro-batch (positions of other categories or types count too).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lakefold.eventstore import InvalidRequestError
from lakefold.eventstore.arrow import (
    PAYLOAD_FIELDS,
    events_schema,
    head_position,
    read_events_range,
)
from lakefold.schemas.arrow import conform_batch
from lakefold.spark._event_payloads import PayloadDecoder, load_registry
from lakefold.spark._source_columns import (
    EVENT_META_SOURCE_COLUMNS,
    META_FIELDS,
    event_records,
)
from lakefold.spark._source_formats import PositionSource, RangeQuery
from lakefold.spark._source_positions import PositionRange
from lakefold.spark._store_dsn import store_dsn_option
from lakefold.spark.exceptions import SparkTerminalError

SOURCE_NAME = "lakefold_events"


@dataclass(frozen=True)
class EventsQuery(RangeQuery):
    """What an events source reads; picklable, shipped to every task."""

    dsn: str
    category: str | None
    types: tuple[str, ...] | None
    registry: str | None
    #: The event columns of the frame (None: all of them; empty: only metadata columns).
    columns: tuple[str, ...] | None = None
    payload_fields: tuple[str, ...] | None = None
    #: The record metadata columns of the frame (all of them unless ``columns`` names some).
    meta: tuple[str, ...] = tuple(f.name for f in META_FIELDS)

    @classmethod
    def parse(cls, options: dict[str, str]) -> EventsQuery:
        lowered = {k.lower(): v for k, v in options.items()}
        types = lowered.get("types")
        type_list = tuple(t.strip() for t in types.split(",") if t.strip()) if types else None
        registry = lowered.get("registry") or None
        named = [c.strip() for c in (lowered.get("columns") or "").split(",") if c.strip()]
        meta_names = [f.name for f in META_FIELDS]
        names = [n for n in named if n not in meta_names]
        meta = tuple(n for n in meta_names if n in named) if named else tuple(meta_names)
        fields = tuple(n.removeprefix("data.") for n in names if n.startswith("data."))
        if fields and registry is None:
            raise SparkTerminalError(
                f"columns {', '.join('data.' + f for f in fields)} name payload fields, which "
                "need typed payloads: set the registry option too")
        column_list = tuple(dict.fromkeys("data" if n.startswith("data.") else n
                                          for n in names))
        try:
            events_schema(column_list or None)
        except InvalidRequestError as e:
            raise SparkTerminalError(str(e)) from e
        query = cls(
            dsn=store_dsn_option(lowered),
            category=lowered.get("category") or None,
            types=type_list or None,
            registry=registry,
            columns=column_list if named else None,
            payload_fields=fields or None,
            meta=meta,
        )
        if fields:
            query.decoder()  # refuses fields no registered type has
        return query

    def read_columns(self) -> tuple[str, ...] | None:
        """The columns to fetch: the selected ones plus what payload decoding needs."""
        if self.columns is None:
            return None
        columns = self.columns
        if self.meta:
            columns = tuple(dict.fromkeys([*columns, *EVENT_META_SOURCE_COLUMNS]))
        if self.registry is not None and "data" in columns:
            return tuple(dict.fromkeys([*columns, "type", "schema_version"]))
        return columns

    def head(self) -> int:
        return head_position(self.dsn)

    def read_range(self, positions: PositionRange, schema: pa.Schema
                   ) -> Iterator[pa.RecordBatch]:
        """The events at ``positions`` as record batches of ``schema`` (in a task)."""
        decoder = self.decoder() if self.columns is None or "data" in self.columns else None
        for batch in read_events_range(
            self.dsn, positions.start, positions.end,
            category=self.category, types=self.types, columns=self.read_columns(),
            shredded=decoder is not None,
        ):
            if decoder is not None:  # only when data is read
                shredded = batch.column(PAYLOAD_FIELDS) \
                    if PAYLOAD_FIELDS in batch.schema.names else None
                data = decoder.decode(batch.column("type"), batch.column("schema_version"),
                                      batch.column("data"), shredded)
                index = batch.schema.get_field_index("data")
                batch = batch.set_column(index, pa.field("data", data.type), data)
            if self.meta:
                batch = event_records(batch)
            yield batch if batch.schema == schema else conform_batch(batch, schema)

    def decoder(self) -> PayloadDecoder | None:
        if self.registry is None:
            return None
        return PayloadDecoder(load_registry(self.registry), self.types, self.payload_fields)

    def arrow_schema(self) -> pa.Schema:
        """The metadata columns selected, then the event columns (``data`` typed with a
        registry)."""
        schema = events_schema(self.columns)
        decoder = self.decoder()
        index = schema.get_field_index("data")
        if decoder is not None and index >= 0:
            schema = schema.set(index, pa.field("data", decoder.struct_type))
        meta = [f for f in META_FIELDS if f.name in self.meta]
        return pa.schema([*meta, *schema])


class EventsDataSource(PositionSource):
    """The event store as a Spark data source named ``lakefold_events``."""

    source_name = SOURCE_NAME

    def parse_query(self, options: dict[str, str]) -> EventsQuery:
        return EventsQuery.parse(options)
