"""What a user writes as a projection's target — ``delta_table(...)``, ``redis_cache(...)``,
``search_index(...)`` — and the checks each makes at registration.

These definitions implement the ``Target`` protocol (``_targets``). They are light on purpose:
Spark's Python workers unpickle them with every projection definition, so they import no
target's driver library; ``open`` finds the storage implementation of the kind through
``_targets.target_class`` (``_delta``, ``_redis``, ``_search``), imported when it is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lakefold.projections.definitions._model import (
    DELETED_COLUMN,
    POSITION_COLUMN,
    TIMESTAMP_COLUMN,
    ProjectionShape,
)
from lakefold.projections.definitions._targets import TruncateMode, open_target
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionStateError,
)

if TYPE_CHECKING:
    from lakefold.projections.definitions._targets import GenerationTarget, TargetContext

#: Columns an SCD2 Delta table adds to the output.
VALID_FROM = "valid_from"
VALID_TO = "valid_to"
CURRENT = "current"
_RESERVED = (VALID_FROM, VALID_TO, CURRENT)

DeltaMode = Literal["append", "upsert", "scd2"]


@dataclass(frozen=True)
class DeltaTableTarget:
    """A Delta table: ``append`` rows, ``upsert`` by ``keys`` (rows with ``_deleted`` true
    delete), or ``scd2`` history with ``valid_from``/``valid_to``/``current`` columns.
    Implements the ``Target`` protocol (``_targets``); its storage: ``_delta``."""

    mode: DeltaMode
    keys: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    valid_from: str = TIMESTAMP_COLUMN

    @property
    def kind(self) -> Literal["delta"]:
        return "delta"

    @property
    def truncate_mode(self) -> TruncateMode:
        return {"append": "keep", "scd2": "drop"}.get(self.mode, "cut")  # type: ignore[return-value]

    @property
    def keeps_history(self) -> bool:
        return self.mode in ("scd2", "append")

    def describe(self) -> str:
        return f"a Delta {self.mode} target"

    def check_fold_key(self, projection: str, key_column: str) -> None:
        if self.mode != "append" and key_column not in self.keys:
            raise MissingKeyError(
                f"projection {projection}: the Delta {self.mode} keys {list(self.keys)} "
                f"must include the fold's key column {key_column!r}"
            )

    def check_output(self, projection: ProjectionShape, columns: list[str],
                     types: Mapping[str, str], *, stateful: bool) -> None:
        if stateful and self.mode in ("append", "scd2") and projection.fold is None:
            raise IncompatibleTargetError(
                f"projection {projection.name}: the transform keeps state (an aggregation, "
                "deduplication or join), so it emits updated rows; a Delta "
                f"{self.mode} target would record every update as a new row. Use "
                "delta_table('upsert', keys=[...])"
            )
        if projection.fold is not None and self.mode == "append":
            raise IncompatibleTargetError(
                f"projection {projection.name}: a fold emits the new state of each changed "
                "key; write it with delta_table('upsert', keys=[...]) or 'scd2', not 'append'"
            )
        check_columns(self, columns, dict(types))

    def check_repairable(self, projection: str) -> None:
        if self.mode != "upsert":
            raise ProjectionStateError(
                f"projection {projection} writes a Delta {self.mode} table, whose rows "
                "cannot be corrected one key at a time; run a full `lakefold rebuild`"
            )

    def open(self, location: str, context: TargetContext) -> GenerationTarget:
        return open_target(self, location, context)


class _OneRowPerKey:
    """``Target`` behaviour of a kind that holds one row per value of one ``key`` column
    (the latest state): Redis and search."""

    key: str

    @property
    def kind(self) -> str:
        raise NotImplementedError

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,)

    @property
    def truncate_mode(self) -> TruncateMode:
        return "cut"

    @property
    def keeps_history(self) -> bool:
        return False

    def describe(self) -> str:
        return f"a {self.kind} target"

    def check_fold_key(self, projection: str, key_column: str) -> None:
        if self.key != key_column:
            raise MissingKeyError(
                f"projection {projection}: the target is keyed by {self.key!r} but the fold "
                f"emits its key as {key_column!r}; use the same column (key_column=...)"
            )

    def check_key_column(self, projection: ProjectionShape, columns: list[str]) -> None:
        if self.key not in columns:
            raise MissingKeyError(
                f"projection {projection.name}: the {self.kind} target's key column "
                f"{self.key!r} is not in the output columns {columns}; add it to the "
                "projection's output"
            )

    def check_repairable(self, projection: str) -> None:
        return None


@dataclass(frozen=True)
class RedisCacheTarget(_OneRowPerKey):
    """One Redis value per key: a hash of the row's columns, or the row as a JSON string.
    Implements the ``Target`` protocol (``_targets``); its storage: ``_redis``."""

    key: str
    format: Literal["hash", "json"] = "hash"

    @property
    def kind(self) -> Literal["redis"]:
        return "redis"


    def check_output(self, projection: ProjectionShape, columns: list[str],
                     types: Mapping[str, str], *, stateful: bool) -> None:
        self.check_key_column(projection, columns)
        if self.format == "hash":
            nested = [c for c in columns if types[c].startswith(("struct", "array", "map"))]
            if nested:
                raise IncompatibleTargetError(
                    f"projection {projection.name}: a Redis hash holds flat fields, but "
                    f"{nested} are nested; use redis_cache(..., format='json') or flatten them"
                )

    def open(self, location: str, context: TargetContext) -> GenerationTarget:
        return open_target(self, location, context)


@dataclass(frozen=True)
class SearchIndexTarget(_OneRowPerKey):
    """A Tantivy index, one document per key. ``text`` columns are tokenized for full-text
    search; every other column is stored and indexed as-is (strings as exact terms).
    Implements the ``Target`` protocol (``_targets``); its storage: ``_search``."""

    key: str
    text: tuple[str, ...]

    @property
    def kind(self) -> Literal["search"]:
        return "search"


    def check_output(self, projection: ProjectionShape, columns: list[str],
                     types: Mapping[str, str], *, stateful: bool) -> None:
        self.check_key_column(projection, columns)
        for column in self.text:
            if column not in columns:
                raise IncompatibleTargetError(
                    f"projection {projection.name}: search text column {column!r} is not in "
                    f"the output columns {columns}"
                )
            if types[column] != "string":
                raise IncompatibleTargetError(
                    f"projection {projection.name}: search text column {column!r} is "
                    f"{types[column]}, not a string"
                )

    def open(self, location: str, context: TargetContext) -> GenerationTarget:
        return open_target(self, location, context)


def delta_table(
    mode: DeltaMode = "upsert", *, keys: tuple[str, ...] | list[str] = (),
    partition_by: tuple[str, ...] | list[str] = (), valid_from: str = TIMESTAMP_COLUMN,
) -> DeltaTableTarget:
    """A Delta table target; ``keys`` are required for ``upsert`` and ``scd2``."""
    if mode not in ("append", "upsert", "scd2"):
        raise IncompatibleTargetError(
            f"Delta mode {mode!r} is unknown; use 'append', 'upsert' or 'scd2'"
        )
    keys_t = tuple(keys)
    if mode != "append" and not keys_t:
        raise MissingKeyError(f"a Delta {mode} target needs keys=[...] naming the key columns")
    return DeltaTableTarget(mode=mode, keys=keys_t, partition_by=tuple(partition_by),
                            valid_from=valid_from)


def redis_cache(key: str, *, format: Literal["hash", "json"] = "hash") -> RedisCacheTarget:
    """A Redis cache target keyed by the ``key`` column."""
    if not isinstance(key, str) or not key:
        raise MissingKeyError("redis_cache() needs key='<column>' naming the key column")
    if format not in ("hash", "json"):
        raise IncompatibleTargetError(f"Redis format {format!r} is unknown; use 'hash' or 'json'")
    return RedisCacheTarget(key=key, format=format)


def search_index(key: str, *, text: tuple[str, ...] | list[str]) -> SearchIndexTarget:
    """A Tantivy search index target keyed by ``key`` with full-text ``text`` columns."""
    if not isinstance(key, str) or not key:
        raise MissingKeyError("search_index() needs key='<column>' naming the document id column")
    text_t = tuple(text)
    if not text_t:
        raise IncompatibleTargetError(
            "search_index() needs text=[...] naming at least one column to search"
        )
    if key in text_t:
        raise IncompatibleTargetError(
            f"search_index(): the key column {key!r} cannot also be a tokenized text column"
        )
    return SearchIndexTarget(key=key, text=text_t)


def check_columns(spec: DeltaTableTarget, columns: list[str], types: dict[str, str]) -> None:
    """Refuse an output that the Delta target cannot take (before anything runs)."""
    for key in spec.keys:
        if key not in columns:
            raise MissingKeyError(
                f"the Delta {spec.mode} key column {key!r} is not in the output columns "
                f"{columns}; add it to the projection's output"
            )
    for column in spec.partition_by:
        if column not in columns:
            raise IncompatibleTargetError(
                f"partition column {column!r} is not in the output columns {columns}"
            )
    if spec.mode == "scd2":
        clash = [c for c in _RESERVED if c in columns]
        if clash:
            raise IncompatibleTargetError(
                f"an SCD2 output cannot have columns named {clash}: the target adds them"
            )
        if spec.valid_from not in columns:
            raise MissingKeyError(
                f"the SCD2 target takes each version's start time from column "
                f"{spec.valid_from!r}, which is not in the output {columns}; keep the source's "
                "_ts column or pass delta_table('scd2', valid_from=...)"
            )
        if not types.get(spec.valid_from, "").startswith("timestamp"):
            raise IncompatibleTargetError(
                f"SCD2 valid_from column {spec.valid_from!r} is {types.get(spec.valid_from)}, "
                "not a timestamp"
            )
        if POSITION_COLUMN not in columns:
            raise MissingKeyError(
                "an SCD2 output needs the _position column to order changes; keep it in the "
                "projection's output"
            )
    if spec.mode == "append" and DELETED_COLUMN in columns:
        raise IncompatibleTargetError(
            "an append-only Delta target cannot delete; drop the _deleted column or use "
            "delta_table('upsert', keys=[...])"
        )
