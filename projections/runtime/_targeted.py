"""Targeted rebuild: recompute one stream's part, or one key range, of a view in place.

A full rebuild (a new generation) is always correct; this is the quick repair for a part of
a view, e.g. after a bug fix in a transform that only affected some keys. It is offered for
projections whose output row for a key depends only on that key's records (stateless
transforms) and whose target can be corrected row by row (Delta upsert, Redis, search):

1. The projection is paused, and the call waits until no runner holds its live generation.
2. Every source is read as a batch from its start up to the generation's committed position,
   narrowed to the stream, through the projection's own transform, narrowed to the key range.
   A changelog is read from its last truncate on, as the live view applied it (``_truncate``).
3. The rows are written to the live generation's target: Redis through the position guard
   (nothing moves backwards), search as one commit that keeps the batch checkpoint, Delta as
   a merge under a separate app id. For a key range, keys of the range that the view still
   holds but the replay did not produce are deleted.
4. The projection is resumed (unless it was paused before): it continues from the same
   position, so nothing is skipped or applied twice.

Folds and stateful transforms are refused: their Spark-managed state would no longer match
the view; rebuild them with a new generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa

from lakefold.projections.definitions._api import Projection
from lakefold.projections.definitions._codec import key_text
from lakefold.projections.definitions._model import DELETED_COLUMN, POSITION_COLUMN
from lakefold.projections.definitions._targets import GenerationTarget, TargetContext
from lakefold.projections.exceptions import ProjectionStateError
from lakefold.projections.runtime._queries import _call_transform, is_stateful
from lakefold.projections.state._catalog import LOCK_NAMESPACE, Catalog, generation_lock_key
from lakefold.spark.internals import range_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_RELEASE_TIMEOUT = 60.0


@dataclass(frozen=True)
class PartReport:
    """What a targeted rebuild rewrote: rows written (deletes included) into ``generation``,
    replayed up to ``position`` (source alias → next position)."""

    generation: int
    rows: int
    deleted: int
    position: dict[str, int]


def _check_supported(projection: Projection) -> None:
    if projection.fold is not None:
        raise ProjectionStateError(
            f"projection {projection.name} is a fold: its per-key state lives in Spark's "
            f"checkpoint and would no longer match the view; run `lakefold rebuild "
            f"{projection.name}` (a new generation) instead"
        )
    projection.target.check_repairable(projection.name)


def _wait_released(dsn: str, name: str, generation: int) -> None:
    deadline = time.monotonic() + _RELEASE_TIMEOUT
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                "AND objid = %s AND objsubid = 2 AND granted",
                (LOCK_NAMESPACE, generation_lock_key(name, generation))).fetchone()
            if not (row and row[0]):
                return
            if time.monotonic() > deadline:
                raise ProjectionStateError(
                    f"projection {name} was paused, but its runner did not stop within "
                    f"{_RELEASE_TIMEOUT:.0f} s; is it stuck? See `lakefold status`"
                )
            time.sleep(0.2)


def _output(spark: SparkSession, projection: Projection, dsn: str,
            position: dict[str, int], stream: str | None) -> DataFrame:
    frames = {}
    for source in projection.sources:
        frame = range_frame(spark, dsn, source, 0, int(position.get(source.alias, 0)),
                            truncates="cut")
        if stream is not None:
            frame = frame.filter(frame["_stream"] == stream)
        frames[source.alias] = frame
    result: DataFrame = _call_transform(projection, frames)  # folds were refused
    if is_stateful(result):
        raise ProjectionStateError(
            f"projection {projection.name} aggregates, deduplicates or joins across records: "
            "its Spark state would no longer match the view; run a full `lakefold rebuild`"
        )
    return result


def _in_range(value: object, low: str | None, high: str | None) -> bool:
    text = key_text(value)
    number = isinstance(value, int | float)

    def compare(bound: str) -> float:
        if number:
            return float(value) - float(bound)  # type: ignore[arg-type]
        return (text > bound) - (text < bound)

    return (low is None or compare(low) >= 0) and (high is None or compare(high) < 0)


def rebuild_part(spark: SparkSession, catalog: Catalog, projection: Projection, *, dsn: str,
                 redis_url: str | None, stream: str | None = None,
                 key_from: str | None = None, key_to: str | None = None) -> PartReport:
    """Recompute the part of ``projection``'s live view that comes from ``stream`` and/or has
    keys in ``[key_from, key_to)``; see the module docstring."""
    if stream is None and key_from is None and key_to is None:
        raise ProjectionStateError("name a --stream or a key range (--key-from/--key-to)")
    _check_supported(projection)
    name = projection.name
    was_paused = catalog.projection(name).paused
    catalog.set_paused(name, True)
    try:
        live = catalog.current(name)
        _wait_released(dsn, name, live.generation)
        live = catalog.current(name)
        position = dict(live.position)
        output = _output(spark, projection, dsn, position, stream)
        key = projection.target.keys[0]
        table = output.toArrow()
        keep = [i for i, value in enumerate(table.column(key).to_pylist())
                if value is not None and _in_range(value, key_from, key_to)]
        table = table.take(pa.array(keep, pa.int64()))
        ranged = key_from is not None or key_to is not None
        target = projection.target.open(
            live.location(projection.target.kind),
            TargetContext(name, live.generation, redis_url=redis_url))
        try:
            stale = _stale_keys(target, table, key, key_from, key_to) if ranged else []
            if stale:
                table = _with_deletes(table, key, stale, sum(position.values()))
            target.repair(table, sum(position.values()))
        finally:
            target.close()
        return PartReport(generation=live.generation, rows=table.num_rows,
                          deleted=len(stale), position=position)
    finally:
        if not was_paused:
            catalog.set_paused(name, False)


def _with_deletes(table: pa.Table, key: str, stale: list[Any], position: int) -> pa.Table:
    extra_columns = {POSITION_COLUMN: position} if POSITION_COLUMN in table.column_names else {}
    rows = [{key: value, DELETED_COLUMN: True, **extra_columns} for value in stale]
    extra = pa.Table.from_pylist(rows, schema=_with_deleted(table.schema))
    base = table if DELETED_COLUMN in table.column_names else table.append_column(
        DELETED_COLUMN, pa.array([False] * table.num_rows, pa.bool_()))
    return pa.concat_tables([base, extra])


def _with_deleted(schema: pa.Schema) -> pa.Schema:
    if DELETED_COLUMN in schema.names:
        return schema
    return schema.append(pa.field(DELETED_COLUMN, pa.bool_()))


def _stale_keys(target: GenerationTarget, table: pa.Table, key: str, low: str | None,
                high: str | None) -> list[Any]:
    """Keys of the range that the view holds but the replay did not produce (live rows)."""
    produced = set()
    deleted = table.column(DELETED_COLUMN).to_pylist() if DELETED_COLUMN in \
        table.column_names else [False] * table.num_rows
    for value, gone in zip(table.column(key).to_pylist(), deleted, strict=True):
        if not gone:
            produced.add(key_text(value))
    held = target.stored_keys()
    if pa.types.is_integer(table.schema.field(key).type):
        held = [int(k) for k in held]  # type: ignore[call-overload]
    return [v for v in held if _in_range(v, low, high) and key_text(v) not in produced]
