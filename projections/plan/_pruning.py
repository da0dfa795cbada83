"""Which event columns a projection's transform reads, so that a rebuild fetches only those.

Spark's Python data source API (4.2) has no column pruning: a source hands every column of its
schema to the JVM, and the projection source's events have 12 (plus the metadata columns), the
costliest of them (``event_id``, ``metadata``, the correlation ids) rarely used. A rebuild reads
the whole log, so it asks the store for the columns the transform references and leaves the
others null (the frame's schema does not change).

The columns are found by a dry run of the transform over empty, static stand-ins of the source
frames (no Python worker, no store access) and a look at the analyzed plan: an event column is
read when an expression above the stand-in refers to its attribute. Anything unexpected
(a transform that needs a streaming frame, a plan that cannot be read) means: read everything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lakefold.projections.definitions._api import Projection
from lakefold.spark.internals import EVENT_META_SOURCE_COLUMNS, EventSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

_ATTRIBUTE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"


def _attribute_ids(value: Any) -> Iterator[int]:
    """Expression ids of the attribute references anywhere in a plan node's JSON."""
    if isinstance(value, dict):
        if value.get("class") == _ATTRIBUTE and isinstance(value.get("exprId"), dict):
            yield int(value["exprId"]["id"])
        for item in value.values():
            yield from _attribute_ids(item)
    elif isinstance(value, list):
        for item in value:
            yield from _attribute_ids(item)


def _referenced_ids(output: DataFrame) -> set[int]:
    """Attributes referred to by the plan's operators (leaves only declare theirs)."""
    nodes = json.loads(output._jdf.queryExecution().analyzed().toJSON())
    return {i for node in nodes if node.get("num-children", 0) > 0
            for i in _attribute_ids(node)}


def _output_ids(frame: DataFrame) -> dict[int, str]:
    attributes = frame._jdf.queryExecution().analyzed().output()
    return {int(attributes.apply(i).exprId().id()): str(attributes.apply(i).name())
            for i in range(attributes.size())}


def event_columns_read(spark: SparkSession, projection: Projection,
                       schemas: Mapping[str, StructType],
                       transform: Callable[[Projection, Mapping[str, DataFrame]], Any],
                       event_columns: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Per event source alias whose transform leaves some of ``event_columns`` unread: the
    columns to fetch (the read ones plus ``EVENT_META_SOURCE_COLUMNS``). Empty when unsure."""
    if projection.fold is not None:
        return {}
    try:
        stand_ins = {alias: spark.createDataFrame([], schema)
                     for alias, schema in schemas.items()}
        referenced = _referenced_ids(transform(projection, stand_ins))
        outputs = {alias: _output_ids(frame) for alias, frame in stand_ins.items()}
    except Exception as e:  # the dry run is an optimisation: without it, read everything
        log.info("projection %s: reading every event column (%s)", projection.name, e)
        return {}
    pruned: dict[str, tuple[str, ...]] = {}
    for source in projection.sources:
        if not isinstance(source, EventSource):
            continue
        used = {name for i, name in outputs[source.alias].items() if i in referenced}
        columns = tuple(c for c in event_columns
                        if c in used or c in EVENT_META_SOURCE_COLUMNS)
        if len(columns) < len(event_columns):
            pruned[source.alias] = columns
    return pruned
