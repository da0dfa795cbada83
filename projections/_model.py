"""Values that describe a projection: its sources, its target, its options, and the record that
fold handlers receive. A source is an input of the source layer
(``lakefold.spark._source_inputs``); ``changelog()`` and ``events()`` build and validate one.

All of them are frozen dataclasses: a projection definition is data that the registry validates
once, the runner ships to Spark's Python workers (so every value here pickles), and the catalog
fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    ProjectionStateError,
)
from lakefold.spark._source_inputs import ChangelogSource, EventSource
from lakefold.spark._source_truncates import Mode

if TYPE_CHECKING:
    from lakefold.projections._api import Projection
    from lakefold.projections._targets import GenerationTarget, TargetContext

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
#: Columns the runner adds to, or reads from, every projection's output.
POSITION_COLUMN = "_position"
DELETED_COLUMN = "_deleted"
TIMESTAMP_COLUMN = "_ts"


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid lower-case identifier, else raise a clear error."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ProjectionDefinitionError(
            f"{kind} name {name!r} is not valid; use 1-63 characters of a-z, 0-9 and _, "
            "starting with a letter (it becomes part of table names, Redis keys and paths)"
        )
    return name


# --------------------------------------------------------------------------------- sources


def changelog(table: str, *, alias: str | None = None) -> ChangelogSource:
    """A changelog stream as a source: ``changelog("public.orders")`` or ``changelog("orders")``.

    ``alias`` names the source for transforms (keyword argument) and fold records
    (``record.source``); it defaults to the table name without its schema.
    """
    if not isinstance(table, str) or not table.strip():
        raise ProjectionDefinitionError("changelog() needs a table name such as 'public.orders'")
    qualified = table if "." in table else f"public.{table}"
    return ChangelogSource(
        table=qualified, alias=check_name("source alias", alias or qualified.split(".", 1)[1])
    )


def event_type_name(event_type: object) -> str:
    """The type name of an event given as a string or as a registered event class."""
    if isinstance(event_type, str):
        if not event_type:
            raise ProjectionDefinitionError("an event type name cannot be empty")
        return event_type
    for attribute in ("event_type", "__event_type__", "type_name"):
        value = getattr(event_type, attribute, None)
        if isinstance(value, str) and value:
            return value
    name = getattr(event_type, "__name__", None)
    if isinstance(name, str):
        return name
    raise ProjectionDefinitionError(
        f"{event_type!r} is neither an event type name nor an event class"
    )


def events(
    category: str | None = None, *, types: tuple[object, ...] | list[object] = (),
    alias: str | None = None,
) -> EventSource:
    """Event-store events as a source: a category (``events("order")``), some types of it
    (``events("order", types=[OrderPlaced])``), or every event (``events()``)."""
    if category is not None and (not isinstance(category, str) or not category):
        raise ProjectionDefinitionError("events() needs a category name or None for all events")
    names = tuple(event_type_name(t) for t in types)
    declared = tuple(event_type_name(t) for t in types if not isinstance(t, str))
    default_alias = re.sub(r"[^a-z0-9_]", "_", (category or "events").lower())
    if not default_alias[:1].isalpha():
        default_alias = f"e_{default_alias}"
    return EventSource(category=category, types=names,
                       alias=check_name("source alias", alias or default_alias),
                       declared=declared)


# --------------------------------------------------------------------------------- targets

DeltaMode = Literal["append", "upsert", "scd2"]
#: How a changelog source hands truncates to a target (see ``_truncate``).
TruncateMode = Mode


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

    def check_output(self, projection: Projection, columns: list[str],
                     types: Mapping[str, str], *, stateful: bool) -> None:
        from lakefold.projections._delta import check_columns

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
        from lakefold.projections._delta import DeltaGenerationTarget

        return DeltaGenerationTarget(self, location, context)


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

    def check_key_column(self, projection: Projection, columns: list[str]) -> None:
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


    def check_output(self, projection: Projection, columns: list[str],
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
        from lakefold.projections._redis import RedisGenerationTarget

        return RedisGenerationTarget(self, location, context)


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


    def check_output(self, projection: Projection, columns: list[str],
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
        from lakefold.projections._search import SearchGenerationTarget

        return SearchGenerationTarget(self, location, context)


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


# --------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class ProjectionOptions:
    """How a projection runs. ``on_error``: after ``retries`` attempts with exponential backoff
    (``backoff_seconds`` doubling up to ``max_backoff_seconds``) a failing record goes to the
    dead letters (``"dead_letter"``) or stops the projection (``"stop"``)."""

    trigger_seconds: float = 1.0
    max_records_per_batch: int = 20_000
    rebuild_records_per_batch: int = 1_000_000
    on_error: Literal["dead_letter", "stop"] = "dead_letter"
    retries: int = 3
    backoff_seconds: float = 0.05
    max_backoff_seconds: float = 5.0
    keep_generations: int = 1

    def __post_init__(self) -> None:
        if self.trigger_seconds < 0:
            raise ProjectionDefinitionError("trigger_seconds must be >= 0")
        if self.max_records_per_batch < 1 or self.rebuild_records_per_batch < 1:
            raise ProjectionDefinitionError("records per batch must be >= 1")
        if self.on_error not in ("dead_letter", "stop"):
            raise ProjectionDefinitionError(
                f"on_error={self.on_error!r} is unknown; use 'dead_letter' or 'stop'"
            )
        if self.retries < 1:
            raise ProjectionDefinitionError("retries must be >= 1 (the first attempt counts)")
        if self.backoff_seconds < 0 or self.max_backoff_seconds < self.backoff_seconds:
            raise ProjectionDefinitionError("need 0 <= backoff_seconds <= max_backoff_seconds")
        if self.keep_generations < 0:
            raise ProjectionDefinitionError("keep_generations must be >= 0")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1)))


# --------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Record:
    """One source record as a fold handler sees it.

    ``type`` is the event type for events, and ``insert``/``update``/``delete`` for changelog
    records; ``data`` is the event payload or the row after the change (before it, for a
    delete); ``stream`` is the event stream id or the table; ``position`` is the record's
    position in its source (event store: the global position).
    """

    source: str
    position: int
    type: str
    stream: str
    data: dict[str, Any]
    timestamp: datetime | None = None
    before: dict[str, Any] | None = None
    event_class: Any = field(default=None, compare=False, repr=False)

    @property
    def event(self) -> Any:
        """The payload validated into the event class the handler was registered with
        (``on(OrderPlaced)``), or the payload dict when it was registered by name."""
        if self.event_class is None:
            return self.data
        validate = getattr(self.event_class, "model_validate", None)
        return validate(self.data) if validate is not None else self.event_class(**self.data)


def fingerprint(value: object) -> str:
    """A short stable hash of a JSON-able description (used to spot changed definitions)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
