"""Values that describe a projection: its sources, its target, its options, and the record that
fold handlers receive. A source is an input of the source layer
(``lakefold.spark._source_inputs``); ``changelog()``, ``events()`` and ``delta_changes()`` build
and validate one.

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
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lakefold.projections.exceptions import (
    ProjectionDefinitionError,
)
from lakefold.spark.internals import ChangelogSource, DeltaSource, EventSource

if TYPE_CHECKING:
    from lakefold.spark.internals import Source

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
#: Columns the runner adds to, or reads from, every projection's output.
POSITION_COLUMN = "_position"
DELETED_COLUMN = "_deleted"
TIMESTAMP_COLUMN = "_ts"


class FoldShape(Protocol):
    """What the checks of a definition read of a fold (``_api.FoldLogic`` is one)."""

    @property
    def handlers(self) -> Mapping[str, Any]: ...


class ProjectionShape(Protocol):
    """What a target's checks read of a projection (``_api.Projection`` is one): its name, its
    sources and whether it folds. Targets take this, not ``Projection``, so that the target
    protocol does not import the projection API that uses it."""

    @property
    def name(self) -> str: ...

    @property
    def sources(self) -> tuple[Source, ...]: ...

    @property
    def fold(self) -> FoldShape | None: ...


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

    A capture with a stream prefix names its streams ``<prefix><schema>.<table>``: pass the
    whole name, ``changelog("sales.public.orders")``.

    ``alias`` names the source for transforms (keyword argument) and fold records
    (``record.source``); it defaults to the table name without its schema (and prefix).
    """
    if not isinstance(table, str) or not table.strip():
        raise ProjectionDefinitionError("changelog() needs a table name such as 'public.orders'")
    qualified = table if "." in table else f"public.{table}"
    return ChangelogSource(
        table=qualified, alias=check_name("source alias", alias or qualified.rsplit(".", 1)[1])
    )


def delta_changes(uri: str, *, key: str | list[str] | tuple[str, ...], alias: str | None = None,
                  starting_version: int | None = None) -> DeltaSource:
    """A Delta table's changes as a source: ``delta_changes("s3://lake/orders", key=["id"])``
    or a local path. Each committed version of the table is read once, in version order, as
    change rows shaped like a changelog's (``_type``/``_op`` ``insert``, ``update`` or
    ``delete``, ``_deleted``, ``_commit_version``, then the table's columns), so folds and
    transforms written for ``changelog()`` work unchanged. Updates and deletes need the
    table's change data feed (``delta.enableChangeDataFeed = true``); without it only
    appends can be read, and a version that deletes or rewrites rows stops the projection
    with an error saying what to run (see ``lakefold.spark._source_delta``).

    ``key``: the column(s) that identify a row of the table (checked against it; they order
    a version's rows). ``starting_version``: start with the whole table as of that version
    (every row an insert), then its later versions; by default every version from 0.
    ``alias`` defaults to the path's last part.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ProjectionDefinitionError(
            "delta_changes() needs a Delta table path or URI such as 's3://lake/orders'")
    keys = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, list | tuple) \
        else ()
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ProjectionDefinitionError(
            f"delta_changes({uri!r}) needs key=[...]: the column(s) that identify a row")
    if starting_version is not None and (not isinstance(starting_version, int)
                                         or isinstance(starting_version, bool)
                                         or starting_version < 0):
        raise ProjectionDefinitionError(
            f"delta_changes({uri!r}): starting_version must be a table version (>= 0)")
    from lakefold.spark.internals import normalize_table_uri

    normalized = normalize_table_uri(uri)
    default_alias = re.sub(r"[^a-z0-9_]", "_", normalized.rstrip("/").rsplit("/", 1)[-1].lower())
    if not default_alias[:1].isalpha():
        default_alias = f"t_{default_alias}"
    return DeltaSource(uri=normalized, key=keys,
                       alias=check_name("source alias", alias or default_alias[:63]),
                       starting_version=starting_version)


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
