"""Per-key fold handlers run by Spark with managed state (``applyInPandasWithState``).

Plan of one fold projection:

1. Every source frame becomes rows of one shape: the record's metadata (``_source``,
   ``_position``, ``_ts``, ``_type``, ``_stream``), its key as text (``_fkey``), and its data
   as a struct column named after the source (typed values survive: decimals stay decimals).
   Records queued for a dead-letter retry join as rows whose ``_retry`` holds the record.
2. Spark groups by ``_fkey``; for each key the Python function below loads the key's state
   from Spark's state store (tagged JSON, see ``_codec``), applies the handlers to the key's
   records in commit order (``_in_commit_order``), and stores the new state. Spark's
   checkpoint keeps the state and the offsets together, so after a crash the state is exactly
   as of the last committed batch, and the replayed batch recomputes the same output.
3. Each key with a changed state emits one row: the state's columns, ``_position`` (the
   highest position folded into it), ``_deleted`` (the handler returned None: the key and its
   state are gone; or the state has ``"_deleted": True``: the row is removed from the target
   but the state is kept, e.g. an aggregate that is hidden while it is empty).
4. A handler that keeps failing (``retries`` attempts with backoff) either stops the
   projection (``on_error="stop"``) or emits a ``_dead_letter`` row and the key's other
   records are still folded: progress continues.
5. A truncate of a changelog source arrives as one ``truncate`` record per key the fold has
   emitted (``_truncate``: the source fans it out, in the truncate's place among the
   stream's records), and is added for a key whose records of that stream in the batch
   precede it (``_truncated_at``). For a key without state it changes nothing; otherwise
   the key's ``on("truncate")`` handler runs, and without one (a single-source fold: all of
   the state came from the truncated table) the key's state is dropped and the key deleted.
   A fold over a changelog emits each row's key as ``_fold_key`` too, which the sink records
   so that later truncates reach it.
"""

from __future__ import annotations

import datetime as dt
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakefold.projections.definitions import _codec
from lakefold.projections.definitions._api import STREAM_KEY, FoldLogic, Handler, Projection
from lakefold.projections.definitions._model import (
    DELETED_COLUMN,
    POSITION_COLUMN,
    ProjectionOptions,
    Record,
)
from lakefold.projections.definitions._truncate import FOLD_KEY_COLUMN, reads_changelog
from lakefold.projections.exceptions import ProjectionTypeError, RecordFailedError
from lakefold.spark.internals import FAN_KEY_COLUMN, TRUNCATE, TRUNCATED_AT_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.state import GroupState
    from pyspark.sql.types import StructType

DEAD_LETTER_COLUMN = "_dead_letter"
#: A change's commit LSN and its place in its source transaction (null for events).
COMMIT_COLUMNS = ("_commit_lsn", "_ordinal")
META_COLUMNS = ("_source", "_position", "_ts", "_type", "_stream")
#: Metadata columns of a source frame that are not part of a record's data.
FRAME_META = frozenset({*META_COLUMNS, DELETED_COLUMN, "_before", FAN_KEY_COLUMN,
                        TRUNCATED_AT_COLUMN})
STATE_SCHEMA = "state string, position long"


@dataclass(frozen=True)
class FoldRuntime:
    """Everything the Python workers need to run a fold (pickled into the UDF)."""

    name: str
    key_fields: Mapping[str, str]
    key_column: str
    source_kinds: Mapping[str, str]
    handlers: Mapping[str, tuple[Handler, Any]]
    initial: Callable[[object], dict[str, Any]] | None
    columns: tuple[str, ...]
    options: ProjectionOptions
    #: How records of different sources are ordered (see ``_in_commit_order``).
    order: str = "position"

    @classmethod
    def of(cls, projection: Projection, columns: tuple[str, ...]) -> FoldRuntime:
        fold = projection.fold
        assert fold is not None  # noqa: S101 - callers pass fold projections only
        aliases = [s.alias for s in projection.sources]
        key = fold.key
        key_fields = dict(key) if isinstance(key, Mapping) else dict.fromkeys(aliases, key)
        return cls(name=projection.name, key_fields=key_fields, key_column=fold.key_column,
                   source_kinds={s.alias: s.kind for s in projection.sources},
                   handlers=dict(fold.handlers), initial=fold.initial, columns=columns,
                   options=projection.options, order=_order_of(projection))


def _order_of(projection: Projection) -> str:
    """``position`` for one source, or events only (a stream's positions, and the event
    store's global position, are their commit order), ``commit`` for several changelogs (the
    source's commit LSN, then the change's place in its transaction), ``time`` when a fold
    mixes changelogs and events (the two stores share no log: commit time)."""
    kinds = {s.kind for s in projection.sources}
    if kinds == {"events"} or len(projection.sources) == 1:
        return "position"
    return "commit" if kinds == {"changelog"} else "time"


def output_schema(fold: FoldLogic, *, track_keys: bool = False) -> StructType:
    """The fold's output columns (its DDL schema) plus the runner's bookkeeping columns
    (with ``track_keys``, the row's key as ``_fold_key``: see step 5 of the module
    docstring)."""
    from pyspark.sql.types import (
        BooleanType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    declared = StructType.fromDDL(fold.schema)
    if not isinstance(declared, StructType):
        raise ProjectionTypeError("a fold schema must be a list of columns")
    return StructType([
        *declared.fields,
        StructField(POSITION_COLUMN, LongType()),
        StructField(DELETED_COLUMN, BooleanType()),
        StructField(DEAD_LETTER_COLUMN, StringType()),
        *([StructField(FOLD_KEY_COLUMN, StringType())] if track_keys else []),
    ])


def fold_input(projection: Projection, frames: Mapping[str, DataFrame],
               retries: DataFrame | None = None) -> DataFrame:
    """The union of the source frames in the shape described in the module docstring."""
    from pyspark.sql import functions as F

    fold = projection.fold
    assert fold is not None  # noqa: S101
    parts = []
    for source in projection.sources:
        frame = frames[source.alias]
        data_columns = [c for c in frame.columns if c not in FRAME_META]
        field = fold.key[source.alias] if isinstance(fold.key, Mapping) else fold.key
        if field == STREAM_KEY:
            key = F.col("_stream")
        elif source.kind == "events" and "data" in frame.columns:
            key = F.get_json_object(F.col("data"), f"$.{field}")
        else:
            key = F.col(field).cast("string")
        if FAN_KEY_COLUMN in frame.columns:  # a truncate fanned out to every key
            key = F.coalesce(F.col(FAN_KEY_COLUMN), key)
        parts.append(frame.select(
            F.lit(source.alias).alias("_source"),
            F.col("_position").cast("long").alias("_position"),
            F.col("_ts").cast("timestamp").alias("_ts"),
            F.col("_type").cast("string").alias("_type"),
            F.col("_stream").cast("string").alias("_stream"),
            *[(F.col(c).cast("long") if c in frame.columns else F.lit(None).cast("long"))
              .alias(c) for c in COMMIT_COLUMNS],
            key.alias("_fkey"),
            F.lit(None).cast("string").alias("_retry"),
            (F.col(TRUNCATED_AT_COLUMN) if TRUNCATED_AT_COLUMN in frame.columns
             else F.lit(None).cast("long")).alias(TRUNCATED_AT_COLUMN),
            F.struct(*[F.col(c) for c in data_columns]).alias(source.alias),
        ))
    if retries is not None:
        parts.append(retries.select("_source", "_position", "_ts", "_type", "_stream", "_fkey",
                                    "_retry"))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part, allowMissingColumns=True)
    return union


def apply_fold(projection: Projection, union: DataFrame) -> DataFrame:
    """Group the union by key and run the handlers with Spark-managed state."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    fold = projection.fold
    assert fold is not None  # noqa: S101
    schema = output_schema(fold, track_keys=reads_changelog(projection))
    runtime = FoldRuntime.of(projection, tuple(schema.fieldNames()))
    return union.groupBy("_fkey").applyInPandasWithState(
        make_fold_function(runtime), schema, STATE_SCHEMA, "update",
        GroupStateTimeout.NoTimeout)


def _timestamp(value: object) -> dt.datetime | None:
    if value is None:
        return None
    to_pydatetime = getattr(value, "to_pydatetime", None)
    if callable(to_pydatetime):
        value = to_pydatetime()
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return None


def _record(row: dict[str, Any], runtime: FoldRuntime) -> Record:
    if row.get("_retry") is not None:
        stored = _codec.loads(row["_retry"])
        return Record(source=stored["source"], position=int(stored["position"]),
                      type=stored["type"], stream=stored["stream"], data=stored["data"],
                      timestamp=stored.get("timestamp"))
    source = str(row["_source"])
    payload = row.get(source) or {}
    if row.get("_type") == TRUNCATE:  # no data: every row of the table is gone
        payload = {}
    if runtime.source_kinds.get(source) == "events" and isinstance(payload.get("data"), str):
        data = _codec.loads(payload["data"])
        if not isinstance(data, dict):
            data = {"value": data}
    else:
        data = {k: (_timestamp(v) if hasattr(v, "to_pydatetime") else v)
                for k, v in payload.items()}
    return Record(source=source, position=int(row["_position"]), type=str(row["_type"]),
                  stream=str(row["_stream"]), data=data, timestamp=_timestamp(row.get("_ts")))


def record_json(record: Record) -> dict[str, Any]:
    """A record as stored in a dead letter (tagged JSON, so a retry gets the same values)."""
    return {"source": record.source, "position": record.position, "type": record.type,
            "stream": record.stream, "data": _codec.plain(record.data),
            "timestamp": _codec.plain(record.timestamp)}


def make_fold_function(runtime: FoldRuntime) -> Callable[..., Iterator[Any]]:
    """The function Spark calls per key and micro-batch (see the module docstring)."""

    def fold(key: tuple[Any, ...], frames: Iterator[Any],
             state: GroupState) -> Iterator[Any]:
        import pandas as pd  # type: ignore[import-untyped]

        rows: list[dict[str, Any]] = []
        for frame in frames:
            rows.extend(frame.to_dict("records"))
        rows = _in_commit_order(rows + _truncates_to_add(rows), runtime.order)
        if state.exists:
            text, position = state.get
            current: dict[str, Any] | None = _codec.loads(text)
        else:
            current, position = None, -1
        out: list[dict[str, Any]] = []
        changed = False
        # The key's typed value (the group key is its text), for the row of a deleted key.
        known = current.get(runtime.key_column) if current is not None else None
        for row in rows:
            record = _record(row, runtime)
            if record.type == TRUNCATE and runtime.source_kinds.get(record.source) == "changelog":
                if current is None:
                    continue  # nothing of this key to clear
                key_value = current.get(runtime.key_column, known)
                if TRUNCATE not in runtime.handlers:  # one source: all of the state is gone
                    known, current, changed = key_value, None, True
                    position = max(position, record.position)
                    continue
            else:
                key_value = _key_value(record, key[0], runtime)
            entry = runtime.handlers.get(record.type)
            if entry is None:
                continue
            handler, event_class = entry
            if event_class is not None:
                record = Record(**{**record.__dict__, "event_class": event_class})
            if key_value is None:
                out.append(_dead_letter(runtime, record, None, "the record has no key field "
                                        f"{runtime.key_fields.get(record.source)!r}", 1))
                continue
            base = current if current is not None else _initial(runtime, key_value)
            result, error, attempts = _attempt(runtime, handler, base, record)
            if error is not None:
                if runtime.options.on_error == "stop":
                    raise RecordFailedError(
                        f"projection {runtime.name}: handler for {record.type} failed on "
                        f"{record.source} position {record.position} after {attempts} "
                        f"attempts: {error}"
                    )
                out.append(_dead_letter(runtime, record, key_value, error, attempts))
                continue
            changed = True
            known = key_value
            position = max(position, record.position)
            if result is None:
                current = None
            else:
                current = dict(result)
                current[runtime.key_column] = key_value
        if changed:
            if current is None:
                if state.exists:
                    state.remove()
                out.append({runtime.key_column: known if known is not None
                            else _key_value_any(rows, runtime, key[0]),
                            POSITION_COLUMN: position, DELETED_COLUMN: True,
                            FOLD_KEY_COLUMN: key[0]})
            else:
                state.update((_codec.dumps(current), position))
                out.append({**{c: current.get(c) for c in runtime.columns},
                            POSITION_COLUMN: position,
                            DELETED_COLUMN: bool(current.get(DELETED_COLUMN)),
                            DEAD_LETTER_COLUMN: None, FOLD_KEY_COLUMN: key[0]})
        if out:
            yield pd.DataFrame([{c: r.get(c) for c in runtime.columns} for r in out],
                               columns=list(runtime.columns), dtype=object)

    return fold


def _in_commit_order(rows: list[dict[str, Any]], order: str) -> list[dict[str, Any]]:
    """A key's new records in the order their sources committed them; retried records after
    them (old records applied late, by request).

    Each source's records stay in their position order. Across sources (``FoldRuntime.order``):
    events by global position; changes by commit LSN, then their place in the transaction, so
    an order inserted after its customer moved city, in the source, is folded after the move
    whatever the two streams' positions are; a fold over both by commit time. A record without
    a commit point (a truncate added for this key) follows the record before it in its
    source."""
    import pandas as pd

    def number(value: Any) -> int | None:
        return None if value is None or pd.isna(value) else int(value)

    new = [r for r in rows if r.get("_retry") is None]
    retried = [r for r in rows if r.get("_retry") is not None]
    if order == "position":
        return sorted(new, key=lambda r: int(r["_position"])) + retried
    by_source: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(new, key=lambda r: int(r["_position"])):
        by_source.setdefault(str(row["_source"]), []).append(row)
    keyed: list[tuple[tuple[Any, ...], int, dict[str, Any]]] = []
    for part in by_source.values():
        last: tuple[Any, ...] = ()
        for row in part:
            lsn, ordinal = number(row.get("_commit_lsn")), number(row.get("_ordinal"))
            raw_ts = row.get("_ts")
            when = None if raw_ts is None or pd.isna(raw_ts) else _timestamp(raw_ts)
            point: tuple[Any, ...] | None
            if order == "commit":
                point = None if lsn is None else (lsn, ordinal or 0)
            else:
                point = None if when is None else (
                    when.timestamp(), lsn if lsn is not None else int(row["_position"]),
                    ordinal or 0)
            last = point if point is not None else last
            keyed.append((last, int(row["_position"]), row))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [row for _, _, row in keyed] + retried


def _truncates_to_add(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Truncate records for this key that the source could not fan out to it: its records
    of a stream that precede a truncate of that stream in the same batch (the key may have
    no state before the batch, so the source did not know it)."""
    import pandas as pd

    have = {(r["_source"], int(r["_position"])) for r in rows
            if r.get("_type") == TRUNCATE and r.get("_retry") is None}
    added: list[dict[str, Any]] = []
    for row in rows:
        at = row.get(TRUNCATED_AT_COLUMN)
        if at is None or pd.isna(at) or (row["_source"], int(at)) in have:
            continue
        have.add((row["_source"], int(at)))
        added.append({"_source": row["_source"], "_position": int(at), "_ts": None,
                      "_type": TRUNCATE, "_stream": row["_stream"], "_retry": None})
    return added


def _initial(runtime: FoldRuntime, key_value: object) -> dict[str, Any]:
    if runtime.initial is not None:
        return dict(runtime.initial(key_value))
    return {runtime.key_column: key_value}


def _key_value(record: Record, fallback: object, runtime: FoldRuntime) -> object:
    field = runtime.key_fields.get(record.source)
    if field == STREAM_KEY:
        return record.stream
    if field is None:
        return fallback
    return record.data.get(field, None) if fallback is not None else None


def _key_value_any(rows: list[dict[str, Any]], runtime: FoldRuntime, fallback: object) -> object:
    for row in rows:
        value = _key_value(_record(row, runtime), fallback, runtime)
        if value is not None:
            return value
    return fallback


def _attempt(runtime: FoldRuntime, handler: Handler, state: dict[str, Any],
             record: Record) -> tuple[dict[str, Any] | None, str | None, int]:
    """Run a handler with retries and backoff: (new state, None, attempts) or
    (None, error text, attempts)."""
    error = ""
    for attempt in range(1, runtime.options.retries + 1):
        try:
            return handler(dict(state), record), None, attempt
        except Exception as e:
            error = "".join(traceback.format_exception_only(e)).strip()
            if attempt < runtime.options.retries:
                time.sleep(runtime.options.backoff(attempt))
    return None, error, runtime.options.retries


def _dead_letter(runtime: FoldRuntime, record: Record, key: object, error: str,
                 attempts: int) -> dict[str, Any]:
    letter = {"ref": f"fold:{record.source}:{record.position}", "stage": "fold",
              "source": record.source, "position": record.position,
              "record": {**record_json(record), "key": _codec.plain(key)},
              "error": error, "attempts": attempts}
    return {DEAD_LETTER_COLUMN: _codec.dumps(letter)}
